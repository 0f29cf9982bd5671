// Package app wires the service from its configuration: what `api serve`
// runs (Serve), and the pieces the operator subcommands share. cmd/api calls
// it; so does the load test's own server (loadtest/server), which serves its
// baseline and peer designs beside the service through Options, so that
// neither they nor their dependencies are in the production binary.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/payments-reference/idempotent-payments/internal/config"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/events"
	"github.com/payments-reference/idempotent-payments/internal/httpapi"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/processor/stripe"
	"github.com/payments-reference/idempotent-payments/internal/reconcile"
	"github.com/payments-reference/idempotent-payments/internal/refunds"
	"github.com/payments-reference/idempotent-payments/internal/telemetry"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// Options extend Serve for a harness. The service itself passes none.
type Options struct {
	// Handler, when set, wraps the API's handler and may serve variants of
	// it, built with httpapi.New from the service's own deps: the load test
	// serves its baseline (the same handlers with the key store taken out)
	// and its peer (the store in Redis) this way, each through exactly the
	// same middleware as the service.
	Handler func(service http.Handler, deps httpapi.Deps) http.Handler
	// WrapTracer wraps the service pool's statement tracer (the load test
	// times the claim statement of each request with it).
	WrapTracer func(pgx.QueryTracer) pgx.QueryTracer
	// SimLatency, SimLatencyP99 give the in-process simulator (test mode)
	// a processor's latency: the load test sizes the outbox against it.
	// The service itself leaves them zero: its simulator answers at once.
	SimLatency, SimLatencyP99 time.Duration
}

// MigrateUp creates the database if it is missing and applies the migrations,
// as the owner role (MIGRATE_DATABASE_URL).
func MigrateUp(ctx context.Context, cfg config.Config) error {
	if err := database.EnsureDatabase(ctx, cfg.MigrateDatabaseURL); err != nil {
		return err
	}
	return database.Migrate(ctx, cfg.MigrateDatabaseURL)
}

// Serve runs the API until ctx ends: the pools, the telemetry, the sweeper,
// the outbox workers and the reconciler, the HTTP server and the metrics
// listener, each stopped in order on the way out.
func Serve(ctx context.Context, cfg config.Config, log *slog.Logger, getenv func(string) string, opts Options) error {
	if cfg.Sim != (config.SimSettings{}) {
		return errors.New("PROCESSOR_SIM_* configure `api processor-sim` only: serve's in-process simulator never misbehaves; point PROCESSOR_URL at a processor-sim to test faults")
	}
	log.Info("starting", cfg.LogAttrs()...)
	switch {
	case cfg.Simulated():
		log.Warn("TEST MODE: PROCESSOR_URL is unset, so payments are charged through the in-process simulator, which moves no money and succeeds every charge; every payment and refund says livemode: false. Set PROCESSOR_URL or PROCESSOR=stripe (APP_ENV=production requires one) for real payments")
	case !cfg.Livemode():
		log.Warn("TEST MODE: STRIPE_SECRET_KEY is a test key: Stripe moves no money, and every payment and refund says livemode: false")
	}
	if cfg.MigrateOnStart {
		log.Info("MIGRATE_ON_START is on (the development default): serve applies migrations with MIGRATE_DATABASE_URL, the owner's credentials; in production run `api migrate up` as its own step (APP_ENV=production turns this off)")
		if err := MigrateUp(ctx, cfg); err != nil {
			return err
		}
		log.Info("migrations applied")
	}
	tel, err := telemetry.Setup(ctx, "idempotent-payments", getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Error("telemetry shutdown", "error", err)
		}
	}()
	var sqlTracer pgx.QueryTracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tel.TracerProvider), otelpgx.WithMeterProvider(tel.MeterProvider))
	if opts.WrapTracer != nil {
		sqlTracer = opts.WrapTracer(sqlTracer)
	}
	pool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: cfg.DBMaxConns, AcquireTimeout: cfg.DBAcquireTimeout, Tracer: sqlTracer,
		IdleInTxTimeout: cfg.DBIdleInTxTimeout, CommitTimeout: cfg.DBCommitTimeout, MeterProvider: tel.MeterProvider})
	if err != nil {
		return err
	}
	defer pool.Close()
	// The pool connects on first use, so the service starts while the
	// database is down; say at once if the service role cannot get in.
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil && ctx.Err() == nil {
			log.Warn("the service role cannot reach the database yet; requests get 503 until it can", "error", err)
		}
	}()
	// Three connections: the key sweeper and the events sweeper each hold
	// one for a whole sweep (they walk the principals, one at a time), and
	// the gauges must not wait behind them.
	maint, err := database.Open(ctx, cfg.MaintenanceDatabaseURL, database.PoolConfig{MaxConns: 3, AcquireTimeout: cfg.DBAcquireTimeout, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer maint.Close()
	if err := idempotency.RegisterStoreMetrics(tel.MeterProvider, maint, 5*time.Second); err != nil {
		return err
	}

	// Background work stops after the server has drained its requests, so
	// the quota's final flush includes their claims, and before the pools
	// close.
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	defer func() {
		stopBackground()
		background.Wait()
	}()
	var quota *idempotency.Quota
	if cfg.KeyQuota > 0 {
		quota = idempotency.NewQuota(pool, idempotency.QuotaConfig{Limit: cfg.KeyQuota, Retention: cfg.Retention(), Refresh: cfg.QuotaRefresh})
		background.Go(func() {
			quota.Run(bg, func(err error) { log.Error("key quota flush failed", "error", err) })
		})
	}
	sweeper, err := newSweeper(cfg, maint, tel.MeterProvider)
	if err != nil {
		return err
	}
	if cfg.SweepInterval > 0 {
		// A sweep that found nothing to delete is the common case: not news.
		sweeper.OnSweep = func(deleted int64) {
			if deleted > 0 {
				log.Info("swept expired idempotency keys", "deleted", deleted)
			}
		}
		background.Go(func() {
			sweeper.Run(bg, cfg.SweepInterval, func(err error) { log.Error("sweep failed", "error", err) })
		})
		background.Go(func() { sweepEvents(bg, cfg, maint, log) })
	}

	proc, err := newProcessor(ctx, cfg, log, tel.TracerProvider, simulator.Config{Latency: opts.SimLatency, LatencyP99: opts.SimLatencyP99})
	if err != nil {
		return err
	}
	if proc, err = processor.Measured(proc, tel.MeterProvider); err != nil {
		return err
	}
	// The outbox's own pool: a backlog of charges queues here for a
	// connection, never in front of a request.
	outboxPool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: cfg.OutboxDBMaxConns, AcquireTimeout: cfg.OutboxJobTimeout, Tracer: sqlTracer, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer outboxPool.Close()
	keyring, err := webhooks.NewKeyring(cfg.WebhookSigningKey)
	if err != nil {
		return err
	}
	if string(cfg.WebhookSigningKey) == string(config.DevelopmentWebhookKey) {
		log.Warn("WEBHOOK_SIGNING_KEY is unset: webhook secrets are derived from the published development key, so anyone can forge this service's webhooks. Set it (openssl rand -base64 32) for anything but a local try")
	}
	urls := webhooks.URLPolicy{AllowPrivate: cfg.WebhookAllowPrivateURLs}
	if urls.AllowPrivate {
		log.Warn("WEBHOOK_ALLOW_PRIVATE_URLS is on (the development default): webhook endpoints may be http and point at loopback and private addresses")
	}
	// The deliveries' own pool, smaller: they are not money, and must not
	// take the connections the charges wait for.
	webhookPool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: cfg.WebhookDBMaxConns, AcquireTimeout: cfg.OutboxJobTimeout, Tracer: sqlTracer, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer webhookPool.Close()
	jobs, err := newOutbox(cfg, outboxPool, webhookPool, proc, keyring, urls, log, tel)
	if err != nil {
		return err
	}
	// The relay moves the jobs requests write into River, in every
	// process, workers or not (one pass at a time across them): a process
	// that only takes requests still hands its jobs to the ones that work
	// them. 50 ms between passes is most of what it adds to a charge's lag.
	// It stops after the server has drained, so the last requests' jobs are
	// relayed now or by the next process. It has a pool of its own: sharing
	// the charges', its passes waited in line behind hundreds of workers for
	// a connection, and the load test's median charge lag went from 0.48 s
	// to 1.23 s.
	relayPool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: cfg.OutboxJobTimeout, Tracer: sqlTracer, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer relayPool.Close()
	relayCtx, stopRelay := context.WithCancel(bg)
	var relaying sync.WaitGroup
	relay := outbox.Relay{Pool: relayPool, Batch: 500, Interval: 50 * time.Millisecond,
		OnError: func(err error) { log.Warn("outbox relay pass failed", "error", err) }}
	relaying.Go(func() { relay.Run(relayCtx) })
	defer func() {
		stopRelay()
		relaying.Wait()
	}()
	if cfg.OutboxWorkers > 0 || cfg.WebhookWorkers > 0 {
		giveUp := outbox.StartWhenReachable(bg, jobs, func(err error) { log.Warn("outbox workers not started yet", "error", err) })
		// After the server has drained: jobs its last requests inserted
		// are worked now or by the next process.
		defer func() {
			giveUp()
			sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
			defer cancel()
			if err := jobs.Stop(sctx); err != nil {
				log.Error("outbox workers stop", "error", err)
			}
		}()
	}
	if err := database.RegisterListLag(tel.MeterProvider, maint); err != nil {
		return err
	}
	if err := outbox.RegisterMetrics(tel.MeterProvider, maint, 5*time.Second); err != nil {
		return err
	}
	if err := webhooks.RegisterMetrics(tel.MeterProvider, maint, 5*time.Second); err != nil {
		return err
	}

	executor, err := idempotency.NewExecutor(pool, idempotency.Config{
		Retention:              cfg.Retention(),
		LockTimeout:            cfg.LockTimeout,
		MaxStoredResponseBytes: cfg.MaxStoredResponseBytes,
		Quota:                  quota,
		TracerProvider:         tel.TracerProvider,
		MeterProvider:          tel.MeterProvider,
	})
	if err != nil {
		return err
	}
	if err := registerLivemode(tel.MeterProvider, cfg.Livemode()); err != nil {
		return err
	}
	deps := httpapi.Deps{
		Livemode:       cfg.Livemode(),
		Logger:         log,
		Pool:           pool,
		Idempotency:    executor,
		Outbox:         outbox.Writer{MaxAttempts: cfg.OutboxMaxAttempts},
		Keyring:        keyring,
		URLs:           urls,
		Webhooks:       Fanout(cfg),
		MaxBodyBytes:   cfg.MaxBodyBytes,
		RequestTimeout: cfg.RequestTimeout,
		RateLimits:     httpapi.RateLimits{PerPrincipal: cfg.RateLimit, PerClient: cfg.RateLimitUnauthenticated},
		TracerProvider: tel.TracerProvider,
		MeterProvider:  tel.MeterProvider,
		Propagator:     tel.Propagator,
	}
	handler := httpapi.New(deps)
	if opts.Handler != nil {
		handler = opts.Handler(handler, deps)
	}
	// The deadlines are ordered so that each failure is answered on the wire:
	// the request's bytes must arrive within BodyTimeout (else 408), its work
	// ends within RequestTimeout (else 503), and the answer is written within
	// RequestTimeout + 5 s. A read deadline past the write deadline would turn
	// a slow body into a closed connection instead of a 408.
	srv := &http.Server{
		Addr:              cfg.Addr,
		Handler:           handler,
		ReadHeaderTimeout: min(5*time.Second, cfg.BodyTimeout),
		ReadTimeout:       cfg.BodyTimeout,
		WriteTimeout:      cfg.RequestTimeout + 5*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("listening", "addr", cfg.Addr)
	if cfg.MetricsAddr != "off" {
		var queues http.Handler
		if cfg.AdminPassword != "" {
			if queues, err = riverUI(bg, jobs, cfg.AdminPassword, log); err != nil {
				return err
			}
			log.Info("serving River UI behind ADMIN_PASSWORD", "addr", cfg.MetricsAddr, "path", "/riverui/")
		}
		metricsSrv := &http.Server{Addr: cfg.MetricsAddr, Handler: operatorMux(tel, cfg.Pprof, queues), ReadHeaderTimeout: 5 * time.Second}
		go func() { errc <- metricsSrv.ListenAndServe() }()
		defer metricsSrv.Close()
		log.Info("serving metrics", "addr", cfg.MetricsAddr, "path", "/metrics")
	}

	select {
	case err := <-errc:
		return fmt.Errorf("listen: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// NewProcessor returns the processor client: for PROCESSOR_URL, or for a
// simulator started in this process on a loopback port, which lives as long
// as ctx.
func NewProcessor(ctx context.Context, cfg config.Config, log *slog.Logger, tp trace.TracerProvider) (processor.Processor, error) {
	return newProcessor(ctx, cfg, log, tp, simulator.Config{})
}

// newProcessor is NewProcessor whose simulator answers after sim's latency.
func newProcessor(ctx context.Context, cfg config.Config, log *slog.Logger, tp trace.TracerProvider, sim simulator.Config) (processor.Processor, error) {
	url := cfg.ProcessorURL
	if cfg.Simulated() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen for the processor simulator: %w", err)
		}
		// No fault switches here: they belong to `api processor-sim`.
		sim.Seed = uint64(time.Now().UnixNano())
		srv := &http.Server{Handler: simulator.New(sim), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		context.AfterFunc(ctx, func() { srv.Close() })
		url = "http://" + l.Addr().String()
		log.Info("processor simulator running in process (test mode)", "url", url)
	}
	// Every worker may be in a call at once: keep that many connections to
	// the processor open between calls. (http.DefaultTransport keeps 2 per
	// host, so hundreds of workers would open and close a connection per
	// call.)
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConns = max(100, cfg.OutboxWorkers)
	base.MaxIdleConnsPerHost = max(2, cfg.OutboxWorkers)
	// Each call is a client span, a child of the job attempt that made it.
	transport := otelhttp.NewTransport(base, otelhttp.WithTracerProvider(tp))
	hc := &http.Client{Timeout: cfg.ProcessorTimeout, Transport: transport}
	if cfg.Processor == config.ProcessorStripe {
		return stripe.New(stripe.Config{SecretKey: cfg.Stripe.SecretKey, URL: cfg.Stripe.URL, PaymentMethod: cfg.Stripe.PaymentMethod, HTTPClient: hc}), nil
	}
	return processor.NewClient(url, hc), nil
}

// newOutbox returns the River client that inserts and works the processor
// jobs of payments and refunds, and the webhook deliveries of their events.
func newOutbox(cfg config.Config, pool, webhookPool *database.Pool, proc processor.Processor, keyring webhooks.Keyring, urls webhooks.URLPolicy, log *slog.Logger, tel *telemetry.Telemetry) (*outbox.Client, error) {
	attempts, err := webhooks.NewAttemptCounter(tel.MeterProvider)
	if err != nil {
		return nil, err
	}
	client := urls.Client(cfg.WebhookTimeout, cfg.WebhookWorkers)
	// Each delivery is a client span, a child of its job's attempt.
	client.Transport = otelhttp.NewTransport(client.Transport, otelhttp.WithTracerProvider(tel.TracerProvider))
	rec := NewReconciler(cfg, pool, proc, log)
	if rec.Errors, err = reconcile.NewErrorCounter(tel.MeterProvider); err != nil {
		return nil, err
	}
	workers := Workers(pool, proc, Announcer(cfg), &webhooks.Deliverer{Pool: webhookPool, Keyring: keyring, Client: client,
		Schedule: cfg.WebhookSchedule, AttemptTimeout: cfg.WebhookTimeout, Attempts: attempts,
		Concurrency: cfg.WebhookEndpointConcurrency, DisableAfter: cfg.WebhookDisableAfter, Livemode: cfg.Livemode()}, rec)
	return outbox.NewClient(pool, workers, outbox.Config{
		Periodic:       []*river.PeriodicJob{reconcile.Periodic(cfg.ReconcileInterval)},
		Workers:        cfg.OutboxWorkers,
		WebhookWorkers: cfg.WebhookWorkers,
		JobTimeout:     cfg.OutboxJobTimeout,
		RescueAfter:    cfg.OutboxRescueAfter,
		MaxAttempts:    cfg.OutboxMaxAttempts,
		RetryBase:      cfg.OutboxRetryBase,
		RetryMax:       cfg.OutboxRetryMax,
		Logger:         log,
		TracerProvider: tel.TracerProvider,
		MeterProvider:  tel.MeterProvider,
	})
}

// Workers returns a worker for every job the service enqueues: charges,
// refunds, webhook deliveries (deliverer), and the reconciler's periodic job
// when rec is not nil (the handler tests run the reconciler themselves).
// The settles' events go to announcer. The service and the handler tests
// both take their workers from here, so a job kind added here is worked in
// both.
func Workers(pool *database.Pool, proc processor.Processor, announcer payments.Announcer, deliverer *webhooks.Deliverer, rec *reconcile.Reconciler) *river.Workers {
	workers := river.NewWorkers()
	river.AddWorker(workers, &payments.ChargeWorker{Pool: pool, Processor: proc, Announcer: announcer})
	river.AddWorker(workers, &refunds.Worker{Pool: pool, Processor: proc, Announcer: announcer})
	river.AddWorker(workers, deliverer)
	if rec != nil {
		river.AddWorker(workers, &reconcile.Worker{Reconciler: rec})
	}
	return workers
}

// registerLivemode reports processor_livemode: 1 when payments move real
// money, 0 in test mode, so a dashboard or an alert sees a production
// deployment that is charging the simulator.
func registerLivemode(mp metric.MeterProvider, live bool) error {
	v := int64(0)
	if live {
		v = 1
	}
	_, err := mp.Meter("github.com/payments-reference/idempotent-payments/cmd/api").Int64ObservableGauge("processor_livemode",
		metric.WithDescription("1 when payments are charged through a real processor (PROCESSOR_URL), 0 in test mode (the in-process simulator: no money moves)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error { o.Observe(v); return nil }))
	if err != nil {
		return fmt.Errorf("livemode gauge: %w", err)
	}
	return nil
}

// NewReconciler returns the reconciler as configured; log hears the rows it
// could not settle.
func NewReconciler(cfg config.Config, pool *database.Pool, proc processor.Processor, log *slog.Logger) *reconcile.Reconciler {
	return &reconcile.Reconciler{Pool: pool, Processor: proc, Grace: cfg.ReconcileGrace, Batch: 1000, Announcer: Announcer(cfg), Log: log}
}

// Announcer returns what records the settles' events and queues their
// webhook deliveries, as configured.
func Announcer(cfg config.Config) events.Announcer {
	return events.Announcer{Fanout: Fanout(cfg)}
}

// Fanout returns what queues an event's webhook deliveries, as configured.
func Fanout(cfg config.Config) webhooks.Fanout {
	return webhooks.Fanout{Schedule: cfg.WebhookSchedule}
}

// sweepEvents deletes events past their retention every SWEEP_INTERVAL,
// until ctx ends.
func sweepEvents(ctx context.Context, cfg config.Config, maint *database.Pool, log *slog.Logger) {
	t := time.NewTicker(cfg.SweepInterval)
	defer t.Stop()
	for {
		n, err := events.Sweep(ctx, maint, cfg.SweepChunk, cfg.SweepPause)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("event sweep failed", "error", err)
		case n > 0:
			log.Info("swept events past their retention", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SweepOnce deletes, once, what is past its retention, on the maintenance
// pool: expired keys ("deleted") and events past theirs ("events_deleted").
// It returns how many of each, by those names, as `api sweep` prints them.
func SweepOnce(ctx context.Context, cfg config.Config, maint *database.Pool) (map[string]int64, error) {
	sweeper, err := newSweeper(cfg, maint, nil)
	if err != nil {
		return nil, err
	}
	keys, err := sweeper.Sweep(ctx)
	if err != nil {
		return nil, err
	}
	evs, err := events.Sweep(ctx, maint, cfg.SweepChunk, cfg.SweepPause)
	if err != nil {
		return nil, err
	}
	return map[string]int64{"deleted": keys, "events_deleted": evs}, nil
}

// newSweeper returns the expiry sweeper as configured, on the maintenance pool.
func newSweeper(cfg config.Config, maint *database.Pool, mp metric.MeterProvider) (*idempotency.Sweeper, error) {
	return idempotency.NewSweeper(maint, idempotency.SweeperConfig{
		Chunk: cfg.SweepChunk, Pause: cfg.SweepPause, Retention: cfg.Retention(), MeterProvider: mp,
	})
}
