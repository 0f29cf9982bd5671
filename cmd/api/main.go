// Command api is the payments service and its operator tools, in one binary:
//
//	api [serve]                                  run the HTTP API (the default)
//	api migrate up                               apply pending migrations
//	api keys create --principal NAME --scopes S  create an API key; prints one JSON line
//	api keys list [--principal NAME]             list API keys, one JSON line each (never a secret)
//	api keys revoke ID                           revoke an API key
//	api sweep                                    delete expired keys once; prints one JSON line
//	api reconcile                                settle undecided payments and refunds from the processor's record once; prints one JSON line
//	api processor-sim                            run the payment processor simulator on ADDR
//	api healthcheck                              exit 0 if the API on ADDR answers /healthz (for container healthchecks)
//
// Settings come from environment variables; see internal/config and README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/config"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/httpapi"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/reconcile"
	"github.com/payments-reference/idempotent-payments/internal/refunds"
	"github.com/payments-reference/idempotent-payments/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  api [serve]
  api migrate up
  api keys create --principal NAME --scopes payments:read,payments:write,refunds:read,refunds:write
  api keys list [--principal NAME]
  api keys revoke ID
  api sweep
  api reconcile
  api processor-sim
  api healthcheck`

// run dispatches to a subcommand. It returns instead of exiting so that
// deferred cleanups run and tests can call it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return runLogging(ctx, args, getenv, stdout, os.Stderr)
}

// runLogging is run with the log written to logOut.
func runLogging(ctx context.Context, args []string, getenv func(string) string, stdout, logOut io.Writer) error {
	// Help comes before the configuration is read: it must work with a
	// broken environment too, and for every subcommand.
	for i, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || (i == 0 && a == "help") {
			return printHelp(stdout)
		}
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: cfg.LogLevel}))

	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, cfg, log, getenv)
	case "migrate":
		if len(args) != 1 || args[0] != "up" {
			return errors.New(usage)
		}
		if err := migrateUp(ctx, cfg); err != nil {
			return err
		}
		log.Info("migrations applied")
		return nil
	case "keys":
		return keys(ctx, cfg, args, stdout)
	case "sweep":
		if len(args) != 0 {
			return errors.New(usage)
		}
		return sweep(ctx, cfg, stdout)
	case "reconcile":
		if len(args) != 0 {
			return errors.New(usage)
		}
		return reconcileOnce(ctx, cfg, log, getenv, stdout)
	case "healthcheck":
		return healthcheck(ctx, cfg)
	case "processor-sim":
		if len(args) != 0 {
			return errors.New(usage)
		}
		return serveSimulator(ctx, cfg, log)
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}

// printHelp prints the subcommands and every setting with its default,
// from config.Settings, the table README.md's is checked against. Two lines
// a setting, so that it fits a terminal whatever the default's length.
func printHelp(w io.Writer) error {
	fmt.Fprintf(w, "%s\n\nSettings (environment variables), their defaults, and what they do:\n", usage)
	for _, s := range config.Settings() {
		fmt.Fprintf(w, "  %s=%s\n      %s\n", s.Name, s.Default, s.Help)
	}
	_, err := fmt.Fprintln(w, "  OTEL_EXPORTER_OTLP_ENDPOINT=\n      export traces over OTLP/HTTP; the other standard OTEL_* variables work too\n\nREADME.md, Configuration, says more about each.")
	return err
}

func migrateUp(ctx context.Context, cfg config.Config) error {
	if err := database.EnsureDatabase(ctx, cfg.MigrateDatabaseURL); err != nil {
		return err
	}
	return database.Migrate(ctx, cfg.MigrateDatabaseURL)
}

func serve(ctx context.Context, cfg config.Config, log *slog.Logger, getenv func(string) string) error {
	if cfg.Sim != (config.SimSettings{}) {
		return errors.New("PROCESSOR_SIM_* configure `api processor-sim` only: serve's in-process simulator never misbehaves; point PROCESSOR_URL at a processor-sim to test faults")
	}
	log.Info("starting", cfg.LogAttrs()...)
	if !cfg.Livemode() {
		log.Warn("TEST MODE: PROCESSOR_URL is unset, so payments are charged through the in-process simulator, which moves no money and succeeds every charge; every payment and refund says livemode: false. Set PROCESSOR_URL (and APP_ENV=production, which requires it) for real payments")
	}
	if cfg.MigrateOnStart {
		log.Info("MIGRATE_ON_START is on (the development default): serve applies migrations with MIGRATE_DATABASE_URL, the owner's credentials; in production run `api migrate up` as its own step (APP_ENV=production turns this off)")
	}
	if cfg.MigrateOnStart {
		if err := migrateUp(ctx, cfg); err != nil {
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
	sqlTracer := otelpgx.NewTracer(otelpgx.WithTracerProvider(tel.TracerProvider), otelpgx.WithMeterProvider(tel.MeterProvider))
	pool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: cfg.DBMaxConns, AcquireTimeout: cfg.DBAcquireTimeout, Tracer: sqlTracer, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
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
	maint, err := database.Open(ctx, cfg.MaintenanceDatabaseURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: cfg.DBAcquireTimeout, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
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
	}

	proc, err := newProcessor(ctx, cfg, log, tel.TracerProvider)
	if err != nil {
		return err
	}
	if proc, err = processor.Measured(proc, tel.MeterProvider); err != nil {
		return err
	}
	jobs, err := newOutbox(cfg, pool, proc, log, tel)
	if err != nil {
		return err
	}
	if cfg.OutboxWorkers > 0 {
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
	if err := outbox.RegisterMetrics(tel.MeterProvider, maint, 5*time.Second); err != nil {
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
	if (cfg.BenchmarkIdempotencyBypass || cfg.BenchmarkRedisPeer != "") && !httpapi.BenchmarkBypassAvailable {
		return errors.New("BENCHMARK_IDEMPOTENCY_BYPASS and BENCHMARK_REDIS_PEER need a binary built with -tags benchmark (the load test builds one); production binaries have neither")
	}
	if err := registerLivemode(tel.MeterProvider, cfg.Livemode()); err != nil {
		return err
	}
	handler := httpapi.New(httpapi.Deps{
		Livemode:           cfg.Livemode(),
		Logger:             log,
		Pool:               pool,
		Idempotency:        executor,
		Outbox:             jobs,
		MaxBodyBytes:       cfg.MaxBodyBytes,
		RequestTimeout:     cfg.RequestTimeout,
		TracerProvider:     tel.TracerProvider,
		MeterProvider:      tel.MeterProvider,
		Propagator:         tel.Propagator,
		ServerTiming:       cfg.ServerTiming,
		BenchmarkBypass:    cfg.BenchmarkIdempotencyBypass,
		BenchmarkRedisPeer: cfg.BenchmarkRedisPeer,
	})
	if cfg.BenchmarkIdempotencyBypass {
		log.Warn("BENCHMARK_IDEMPOTENCY_BYPASS is on: POST /benchmark/payments-without-idempotency writes payments with no idempotency protection; for load tests only")
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
		metricsSrv := &http.Server{Addr: cfg.MetricsAddr, Handler: metricsMux(tel, cfg.Pprof), ReadHeaderTimeout: 5 * time.Second}
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

// healthcheck asks the API on ADDR for /healthz, for a container's
// healthcheck in an image that has no curl.
func healthcheck(ctx context.Context, cfg config.Config) error {
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return fmt.Errorf("ADDR %q: %w", cfg.Addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthz: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: status %d", resp.StatusCode)
	}
	return nil
}

// newProcessor returns the processor client: for PROCESSOR_URL, or for a
// simulator started in this process on a loopback port, which lives as long
// as ctx.
func newProcessor(ctx context.Context, cfg config.Config, log *slog.Logger, tp trace.TracerProvider) (processor.Processor, error) {
	url := cfg.ProcessorURL
	if url == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen for the processor simulator: %w", err)
		}
		// No fault switches here: they belong to `api processor-sim`.
		srv := &http.Server{Handler: processor.NewSimulator(processor.SimConfig{Seed: uint64(time.Now().UnixNano())}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		context.AfterFunc(ctx, func() { srv.Close() })
		url = "http://" + l.Addr().String()
		log.Info("processor simulator running in process (test mode)", "url", url)
	}
	// Each call is a client span, a child of the job attempt that made it.
	transport := otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(tp))
	return processor.NewClient(url, &http.Client{Timeout: cfg.ProcessorTimeout, Transport: transport}), nil
}

func simConfig(cfg config.Config) processor.SimConfig {
	return processor.SimConfig{Latency: cfg.Sim.Latency, ErrorRate: cfg.Sim.ErrorRate, DropRate: cfg.Sim.DropRate,
		TimeoutRate: cfg.Sim.TimeoutRate, Hold: cfg.Sim.Hold, Seed: uint64(time.Now().UnixNano())}
}

// serveSimulator runs the processor simulator alone, on ADDR, until ctx ends.
func serveSimulator(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	srv := &http.Server{Addr: cfg.Addr, Handler: processor.NewSimulator(simConfig(cfg)), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("processor simulator listening", "addr", cfg.Addr)
	select {
	case err := <-errc:
		return fmt.Errorf("listen: %w", err)
	case <-ctx.Done():
		return srv.Close()
	}
}

// newOutbox returns the River client that inserts and works the processor
// jobs of payments and refunds.
func newOutbox(cfg config.Config, pool *database.Pool, proc processor.Processor, log *slog.Logger, tel *telemetry.Telemetry) (*outbox.Client, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &payments.ChargeWorker{Pool: pool, Processor: proc})
	river.AddWorker(workers, &refunds.Worker{Pool: pool, Processor: proc})
	river.AddWorker(workers, &reconcile.Worker{Reconciler: newReconciler(cfg, pool, proc)})
	return outbox.NewClient(pool, workers, outbox.Config{
		Periodic:       []*river.PeriodicJob{reconcile.Periodic(cfg.ReconcileInterval)},
		Workers:        cfg.OutboxWorkers,
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

func newReconciler(cfg config.Config, pool *database.Pool, proc processor.Processor) *reconcile.Reconciler {
	return &reconcile.Reconciler{Pool: pool, Processor: proc, Grace: cfg.ReconcileGrace, Batch: 1000}
}

// reconcileOnce settles what waits for reconciliation, for operators: after
// a processor outage, or to see at once what the periodic job would do.
func reconcileOnce(ctx context.Context, cfg config.Config, log *slog.Logger, getenv func(string) string, stdout io.Writer) error {
	if cfg.ProcessorURL == "" {
		// A simulator started here would have an empty ledger and answer
		// "no record" for everything: that would record payments as failed
		// that the service's own simulator may have charged.
		return errors.New("api reconcile needs PROCESSOR_URL: it asks the processor's ledger, and an in-process simulator has none; a serve with the in-process simulator reconciles on its own")
	}
	pool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: cfg.DBAcquireTimeout, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer pool.Close()
	proc, err := newProcessor(ctx, cfg, log, noop.NewTracerProvider())
	if err != nil {
		return err
	}
	res, err := newReconciler(cfg, pool, proc).Run(ctx)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

func newSweeper(cfg config.Config, maint *database.Pool, mp metric.MeterProvider) (*idempotency.Sweeper, error) {
	return idempotency.NewSweeper(maint, idempotency.SweeperConfig{
		Chunk: cfg.SweepChunk, Pause: cfg.SweepPause, Retention: cfg.Retention(), MeterProvider: mp,
	})
}

// metricsMux serves /metrics, and /debug/pprof/ when enabled; it listens
// apart from the API so neither is ever exposed with it.
func metricsMux(tel *telemetry.Telemetry, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.MetricsHandler)
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// sweep deletes expired keys once, for operators and cron, and reports what
// it did.
func sweep(ctx context.Context, cfg config.Config, stdout io.Writer) error {
	maint, err := database.Open(ctx, cfg.MaintenanceDatabaseURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: cfg.DBAcquireTimeout, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer maint.Close()
	sweeper, err := newSweeper(cfg, maint, nil)
	if err != nil {
		return err
	}
	deleted, err := sweeper.Sweep(ctx)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(map[string]any{"deleted": deleted})
}

// keys runs the key subcommands as the owner role: the service role cannot
// write API keys.
func keys(ctx context.Context, cfg config.Config, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	conn, err := pgx.Connect(ctx, cfg.MigrateDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as owner: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	switch args[0] {
	case "create":
		fs := flag.NewFlagSet("keys create", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		name := fs.String("principal", "", "principal (tenant) name")
		scopes := fs.String("scopes", "", "comma-separated scopes")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 0 {
			return errors.New(usage)
		}
		var key auth.NewKey
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
			key, err = auth.CreateKey(ctx, tx, *name, strings.Split(*scopes, ","))
			return err
		})
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(key)
	case "list":
		fs := flag.NewFlagSet("keys list", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		name := fs.String("principal", "", "only this principal's keys")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 0 {
			return errors.New(usage)
		}
		list, err := auth.ListKeys(ctx, conn, *name)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		for _, k := range list {
			if err := enc.Encode(k); err != nil {
				return err
			}
		}
		return nil
	case "revoke":
		if len(args) != 2 {
			return errors.New(usage)
		}
		id, err := uuid.Parse(args[1])
		if err != nil {
			return fmt.Errorf("key id %q is not a uuid", args[1])
		}
		if err := auth.RevokeKey(ctx, conn, id); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "{\"id\":%q,\"revoked\":true}\n", id)
		return nil
	default:
		return errors.New(usage)
	}
}
