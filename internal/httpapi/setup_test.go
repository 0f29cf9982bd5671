package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/payments-reference/idempotent-payments/internal/app"
	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/events"
	"github.com/payments-reference/idempotent-payments/internal/httpapi"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/reconcile"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/faultproxy"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// options tune the service a test runs against.
type options struct {
	maxConns       int32
	acquireTimeout time.Duration
	lockTimeout    time.Duration
	maxBodyBytes   int64
	maxStored      int    // MaxStoredResponseBytes
	keyQuota       int64  // 0: no quota
	databaseURL    string // overrides the test database's service-role URL
	requestTimeout time.Duration
	idleInTx       time.Duration // the pool's IdleInTxTimeout
	commitTimeout  time.Duration // the pool's CommitTimeout (its default unless set)
	// faultProxy puts a faultproxy.Proxy between the service pool and the
	// database, as testBundle.proxy.
	faultProxy bool
	// noWorkers leaves outbox jobs unworked: payments stay processing.
	noWorkers bool
	// holdProcessor makes every processor call wait until the test calls
	// testBundle.releaseProcessor, so a payment stays processing (and a
	// refund pending) for exactly as long as the test needs, however fast
	// or slow the machine is.
	holdProcessor bool
	// maxAttempts is the outbox's retry budget (5 unless set).
	maxAttempts int
	// beforeQuery, when set, is called before the service pool sends each
	// statement, and may block it: a test stages an interleaving with it.
	beforeQuery func(sql string)
	// roundTrips, when set, counts what the service pool sends to the
	// server and waits for: every statement, batch and prepare.
	roundTrips *roundTripCounter
	// urls decides which webhook URLs are accepted, and where deliveries
	// may connect; the default allows private addresses (the tests'
	// receivers listen on loopback).
	urls webhooks.URLPolicy
	// webhookSchedule is the delivery schedule (testSchedule unless set).
	webhookSchedule []time.Duration
	// rateLimits are the API's (none unless set).
	rateLimits httpapi.RateLimits
	// processor, when set, wraps the simulator: a test answers some calls
	// itself, as a real processor might.
	processor func(sim http.Handler) http.Handler
	// endpointConcurrency and disableAfter are the Deliverer's
	// Concurrency and DisableAfter (none unless set).
	endpointConcurrency int
	disableAfter        time.Duration
	// processorTimeout bounds one processor call (5 s unless set).
	processorTimeout time.Duration
	// webhookTimeout bounds a delivery attempt, and jobTimeout any job's
	// attempt (5 s and 10 s unless set).
	webhookTimeout, jobTimeout time.Duration
	// partitioned hash-partitions every tenant table by principal_id
	// (testdata/partition_by_principal.sql) before the service starts.
	partitioned bool
	// statements, when set, records every statement the service and
	// maintenance pools send.
	statements *statementRecorder
}

// testSchedule is the webhook delivery schedule of tests: eight attempts,
// like the published one, a few milliseconds apart.
var testSchedule = []time.Duration{0, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond,
	20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}

// testKeyring derives the tests' webhook secrets.
var testKeyring = func() webhooks.Keyring {
	k, err := webhooks.NewKeyring([]byte("the tests' webhook signing key, 32 bytes at least"))
	if err != nil {
		panic(err)
	}
	return k
}()

// testBundle is a running API on its own database.
type testBundle struct {
	db      testdb.DB
	pool    *database.Pool
	srv     *httptest.Server
	handler http.Handler
	admin   *pgxpool.Pool // superuser: sees every tenant's rows, for assertions
	logs    *syncBuffer
	// quota is nil unless options.keyQuota is set; tests call Flush.
	quota   *idempotency.Quota
	sweeper *idempotency.Sweeper
	maint   *database.Pool    // the maintenance role: sweeps and gauges
	proxy   *faultproxy.Proxy // nil unless options.faultProxy
	// sim is the processor the outbox workers call.
	sim *simulator.Simulator
	// reconciler settles what the outbox left undecided; tests run it
	// by hand, with no grace period.
	reconciler *reconcile.Reconciler
	// release opens the processor gate of options.holdProcessor; nil
	// without it.
	release func()
	// spans and metrics record what the service reported.
	spans   *tracetest.SpanRecorder
	metrics *sdkmetric.ManualReader
}

func setup(t *testing.T, tweak ...func(*options)) *testBundle {
	t.Helper()
	// A small pool, as the connection budget wants: concurrent requests
	// queue for a connection, which is what a pool is for, and the generous
	// acquire timeout keeps a busy shared server from turning a queue into
	// a 503.
	o := options{maxConns: 4, acquireTimeout: 15 * time.Second, lockTimeout: 5 * time.Second, maxBodyBytes: 1 << 20, maxStored: 64 << 10,
		requestTimeout: 30 * time.Second, maxAttempts: 5, urls: webhooks.URLPolicy{AllowPrivate: true}, webhookSchedule: testSchedule,
		webhookTimeout: 5 * time.Second, jobTimeout: 10 * time.Second, processorTimeout: 5 * time.Second}
	for _, f := range tweak {
		f(&o)
	}
	ctx := context.Background()
	b := &testBundle{db: testdb.New(t, setupConns(o)), logs: &syncBuffer{}, spans: tracetest.NewSpanRecorder(), metrics: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.metrics))
	url := b.db.AppURL
	if o.databaseURL != "" {
		url = o.databaseURL
	}
	if o.faultProxy {
		u, err := neturl.Parse(url)
		require.NoError(t, err)
		b.proxy, err = faultproxy.Start(u.Host)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.proxy.Close() })
		url, err = b.proxy.Via(url)
		require.NoError(t, err)
	}
	var tracer pgx.QueryTracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp))
	if o.beforeQuery != nil {
		tracer = gatedTracer{QueryTracer: tracer, before: o.beforeQuery}
	}
	if o.roundTrips != nil {
		tracer = o.roundTrips
	}
	var maintTracer pgx.QueryTracer
	if o.statements != nil {
		tracer, maintTracer = o.statements, o.statements
	}
	if o.partitioned {
		partitionByPrincipal(t, b.db.AdminURL)
	}
	pool, err := database.Open(ctx, url, database.PoolConfig{MaxConns: o.maxConns, AcquireTimeout: o.acquireTimeout, CommitTimeout: o.commitTimeout,
		Tracer: tracer, IdleInTxTimeout: o.idleInTx})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.pool = pool

	adminCfg, err := pgxpool.ParseConfig(b.db.AdminURL)
	require.NoError(t, err)
	adminCfg.MaxConns = adminConns
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	b.admin = admin

	maint, err := database.Open(ctx, b.db.MaintenanceURL, database.PoolConfig{MaxConns: maintConns, AcquireTimeout: o.acquireTimeout, Tracer: maintTracer})
	require.NoError(t, err)
	t.Cleanup(maint.Close)
	b.maint = maint
	b.sweeper, err = idempotency.NewSweeper(maint, idempotency.SweeperConfig{Chunk: 100, Pause: time.Millisecond, Retention: 25 * time.Hour, MeterProvider: mp})
	require.NoError(t, err)
	if o.keyQuota > 0 {
		b.quota = idempotency.NewQuota(pool, idempotency.QuotaConfig{Limit: o.keyQuota, Retention: 25 * time.Hour, Refresh: time.Hour})
	}

	require.NoError(t, idempotency.RegisterStoreMetrics(mp, maint, 0))
	require.NoError(t, outbox.RegisterMetrics(mp, maint, 0))
	b.sim = simulator.New(simulator.Config{})
	var simHandler http.Handler = b.sim
	if o.processor != nil {
		simHandler = o.processor(b.sim)
	}
	if o.holdProcessor {
		gate := make(chan struct{})
		b.release = sync.OnceFunc(func() { close(gate) })
		simHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-gate:
				b.sim.ServeHTTP(w, r)
			case <-r.Context().Done():
			}
		})
	}
	simSrv := httptest.NewServer(simHandler)
	t.Cleanup(simSrv.Close)
	proc, err := processor.Measured(processor.NewClient(simSrv.URL, &http.Client{Timeout: o.processorTimeout,
		Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(tp))}), mp)
	require.NoError(t, err)
	fanout := webhooks.Fanout{Schedule: o.webhookSchedule}
	reconcileErrors, err := reconcile.NewErrorCounter(mp)
	require.NoError(t, err)
	b.reconciler = &reconcile.Reconciler{Pool: pool, Processor: proc, Batch: 100, Announcer: events.Announcer{Fanout: fanout}, Errors: reconcileErrors,
		Log: slog.New(slog.NewJSONHandler(b.logs, nil))}
	require.NoError(t, webhooks.RegisterMetrics(mp, maint, 0))
	attempts, err := webhooks.NewAttemptCounter(mp)
	require.NoError(t, err)
	whClient := o.urls.Client(o.webhookTimeout, webhookWorkers)
	whClient.Transport = otelhttp.NewTransport(whClient.Transport, otelhttp.WithTracerProvider(tp))
	workers := app.Workers(pool, proc, events.Announcer{Fanout: fanout}, &webhooks.Deliverer{Pool: pool, Keyring: testKeyring, Client: whClient,
		Schedule: o.webhookSchedule, AttemptTimeout: o.webhookTimeout, Attempts: attempts,
		Concurrency: o.endpointConcurrency, DisableAfter: o.disableAfter}, nil)
	jobs, err := outbox.NewClient(pool, workers, outbox.Config{
		Workers: outboxWorkers, WebhookWorkers: webhookWorkers, JobTimeout: o.jobTimeout, RescueAfter: 3 * o.jobTimeout,
		MaxAttempts: o.maxAttempts, RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		TracerProvider: tp, MeterProvider: mp,
	})
	require.NoError(t, err)
	if !o.noWorkers {
		relayCtx, stopRelay := context.WithCancel(ctx)
		var relaying sync.WaitGroup
		relay := outbox.Relay{Pool: pool, Batch: 100, Interval: 10 * time.Millisecond,
			OnError: func(err error) { t.Logf("outbox relay pass failed: %v", err) }}
		relaying.Go(func() { relay.Run(relayCtx) })
		giveUp := outbox.StartWhenReachable(ctx, jobs, func(err error) { t.Logf("outbox workers not started yet: %v", err) })
		t.Cleanup(func() {
			stopRelay()
			relaying.Wait()
			giveUp()
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, jobs.Stop(sctx))
		})
	}

	executor, err := idempotency.NewExecutor(pool, idempotency.Config{
		Retention: 25 * time.Hour, LockTimeout: o.lockTimeout, MaxStoredResponseBytes: o.maxStored, Quota: b.quota,
		TracerProvider: tp, MeterProvider: mp,
	})
	require.NoError(t, err)

	log := slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := httpapi.New(httpapi.Deps{
		Logger:         log,
		Pool:           pool,
		Idempotency:    executor,
		Outbox:         outbox.Writer{MaxAttempts: o.maxAttempts},
		Keyring:        testKeyring,
		URLs:           o.urls,
		Webhooks:       fanout,
		TracerProvider: tp,
		MeterProvider:  mp,
		Propagator:     propagation.TraceContext{},
		MaxBodyBytes:   o.maxBodyBytes,
		RequestTimeout: o.requestTimeout,
		RateLimits:     o.rateLimits,
	})
	b.handler = h
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	if b.release != nil {
		// Registered last so it runs first: the workers stop, and the
		// simulator closes, only once no call waits at the gate.
		t.Cleanup(b.release)
	}
	// The service's own log explains a failure (a 503's cause is logged
	// there, not sent to the client), so a failing test shows it.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s", b.logs.String())
		}
	})
	return b
}

// gatedTracer calls before ahead of each statement, then traces it.
type gatedTracer struct {
	pgx.QueryTracer
	before func(sql string)
}

func (g gatedTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	g.before(data.SQL)
	return g.QueryTracer.TraceQueryStart(ctx, conn, data)
}

// releaseProcessor lets the processor calls held by options.holdProcessor
// through, and every later one.
func (b *testBundle) releaseProcessor(t *testing.T) {
	t.Helper()
	require.NotNil(t, b.release, "the bundle was not set up with holdProcessor")
	b.release()
}

// settleWithin is generous: the outbox competes for a loaded machine's two
// cores with every other test binary of the run, and the wait ends as soon as
// the status changes.
const settleWithin = time.Minute

// Connections a bundle holds besides the service pool.
const (
	adminConns = 2 // assertions across tenants
	maintConns = 2 // the sweeper holds one, the store gauges take another
	// spareConns covers the owner connection newKey opens and one more a
	// test may open by hand (a lock holder).
	spareConns = 2
	// outboxWorkers work jobs on the service pool; River's producer and
	// maintenance take up to two connections of their own besides.
	outboxWorkers  = 2
	webhookWorkers = 2
	outboxConns    = 2
)

// setupConns is the most connections a bundle built with o holds at once,
// what it reserves from the run's budget.
func setupConns(o options) int {
	return int(o.maxConns) + adminConns + maintConns + spareConns + outboxConns
}

// newKey creates an API key for principal (created if new) and returns its secret.
func (b *testBundle) newKey(t *testing.T, principal string, scopes ...string) auth.NewKey {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.db.OwnerURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var k auth.NewKey
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
		k, err = auth.CreateKey(ctx, tx, principal, scopes)
		return err
	})
	require.NoError(t, err)
	return k
}

// allScopes is every scope: what most test keys hold.
var allScopes = auth.KnownScopes

// response is what a client saw.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// call is one request; zero fields are not sent.
type call struct {
	method, path, secret, key, body, contentType string
	header                                       http.Header // sent as well
	// offSpec marks a request the spec cannot describe (an unknown path, a
	// method the path does not have); its response is not contract-checked.
	offSpec bool
}

func (b *testBundle) do(t *testing.T, c call) response {
	t.Helper()
	req, err := http.NewRequest(c.method, b.srv.URL+c.path, strings.NewReader(c.body))
	require.NoError(t, err)
	for k, v := range c.header {
		req.Header[k] = v
	}
	if c.secret != "" {
		req.Header.Set("Authorization", "Bearer "+c.secret)
	}
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	switch {
	case c.contentType != "":
		req.Header.Set("Content-Type", c.contentType)
	case c.body != "":
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{Status: resp.StatusCode, Header: resp.Header, Body: body}
	if !c.offSpec {
		checkContract(t, req, r)
	}
	return r
}

func (b *testBundle) post(t *testing.T, path, secret, key, body string) response {
	t.Helper()
	return b.do(t, call{method: http.MethodPost, path: path, secret: secret, key: key, body: body})
}

func (b *testBundle) get(t *testing.T, path, secret string) response {
	t.Helper()
	return b.do(t, call{method: http.MethodGet, path: path, secret: secret})
}

// listed waits until the list at path shows at least n items, and returns
// that page. A list shows a new item once every write transaction that
// began before it has ended (payments.List), which on a server shared with
// other tests can take a moment.
func (b *testBundle) listed(t *testing.T, path, secret string, n int) map[string]any {
	t.Helper()
	var page map[string]any
	require.Eventually(t, func() bool {
		r := b.get(t, path, secret)
		if r.Status != http.StatusOK {
			return false
		}
		page = decode(t, r.Body)
		data, _ := page["data"].([]any)
		return len(data) >= n
	}, time.Minute, 20*time.Millisecond, "the list at %s never showed %d items", path, n)
	return page
}

// count runs a count(*) query as the superuser, across every tenant.
func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.admin.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// jobs counts the outbox's jobs that match where (on kind and args),
// wherever they are: in River's table, or in outbox_jobs still waiting for
// the relay. A row the relay has copied but not yet deleted counts once.
func (b *testBundle) jobs(t *testing.T, where string, args ...any) int {
	t.Helper()
	return b.count(t, `
		SELECT (SELECT count(*) FROM river_job WHERE `+where+`)
		     + (SELECT count(*) FROM outbox_jobs o WHERE `+where+` AND NOT EXISTS (
		            SELECT FROM river_job j WHERE j.unique_key = convert_to('outbox:', 'UTF8') || uuid_send(o.id)))`, args...)
}

// unfinished counts the outbox's jobs of kind not yet completed: waiting
// for the relay, or in River's table in any other state.
func (b *testBundle) unfinished(t *testing.T, kind string) int {
	t.Helper()
	return b.count(t, `
		SELECT (SELECT count(*) FROM river_job WHERE kind = $1 AND state <> 'completed')
		     + (SELECT count(*) FROM outbox_jobs WHERE kind = $1)`, kind)
}

// deleteJobs deletes the outbox's jobs that match where (on kind and
// args), wherever they are, as an operator or a lossy failover could.
func (b *testBundle) deleteJobs(t *testing.T, where string, args ...any) {
	t.Helper()
	for _, table := range []string{"outbox_jobs", "river_job"} {
		_, err := b.admin.Exec(context.Background(), `DELETE FROM `+table+` WHERE `+where, args...)
		require.NoError(t, err)
	}
}

// decode parses a JSON body into a map.
func decode(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m), "body: %s", body)
	return m
}

// requireProblem asserts an RFC 9457 response of the given status and type.
func requireProblem(t *testing.T, r response, status int, slug string) {
	t.Helper()
	require.Equal(t, status, r.Status, "body: %s", r.Body)
	require.Equal(t, httpapi.ContentTypeProblem, r.Header.Get("Content-Type"))
	p := decode(t, r.Body)
	require.Equal(t, httpapi.ProblemTypeBase+slug, p["type"])
	require.EqualValues(t, status, p["status"])
	require.NotEmpty(t, p["title"])
	require.NotEmpty(t, p["detail"])
	require.Equal(t, r.Header.Get("X-Request-Id"), p["request_id"])
}

// syncBuffer is a log sink that tests read after the requests are done.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func itoa(i int) string { return strconv.Itoa(i) }

func randomSuffix() string { return strconv.FormatUint(rand.Uint64(), 36) }

// concurrently runs fn(0..n-1) in n goroutines released at the same moment,
// and waits for all of them.
func concurrently(n int, fn func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			fn(i)
		})
	}
	close(start)
	wg.Wait()
}

// createPayment makes a payment of amount, waits until the outbox worker has
// charged it, and returns its id.
func (b *testBundle) createPayment(t *testing.T, secret string, amount int) string {
	t.Helper()
	r := b.post(t, "/v1/payments", secret, "payment-"+t.Name()+"-"+randomSuffix(), `{"amount": `+itoa(amount)+`, "currency": "eur"}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	id := decode(t, r.Body)["id"].(string)
	require.Equal(t, "succeeded", b.settled(t, "/v1/payments/"+id, secret)["status"])
	return id
}

// settled polls a payment or refund until it leaves its first status
// (processing, pending) and returns it.
func (b *testBundle) settled(t *testing.T, path, secret string) map[string]any {
	t.Helper()
	var last map[string]any
	require.Eventually(t, func() bool {
		r := b.get(t, path, secret)
		last = decode(t, r.Body)
		return r.Status == http.StatusOK && last["status"] != "processing" && last["status"] != "pending"
	}, settleWithin, 20*time.Millisecond, "never settled: %v", last)
	return last
}

// gauge reads the current value of a gauge the service reports; it fails the
// test when there is no such gauge.
func (b *testBundle) gauge(t *testing.T, name string) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				require.Len(t, d.DataPoints, 1)
				return float64(d.DataPoints[0].Value)
			case metricdata.Gauge[float64]:
				require.Len(t, d.DataPoints, 1)
				return d.DataPoints[0].Value
			}
		}
	}
	require.Failf(t, "no such gauge", "%s", name)
	return 0
}

// counter reads the value of an int64 counter the service reported.
func (b *testBundle) counter(t *testing.T, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range d.DataPoints {
					total += p.Value
				}
			}
		}
	}
	return total
}

// effects counts what the receiver applied for an object.
func (b *testBundle) effects(t *testing.T, objectID string) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM effects WHERE object_id = $1`, objectID)
}
