// Package config reads the service's settings from the environment. Every
// setting has a default that works on a developer machine with PostgreSQL on
// localhost; Load refuses values that make no sense instead of guessing.
package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	idempotentpayments "github.com/payments-reference/idempotent-payments"
	"github.com/payments-reference/idempotent-payments/internal/database"
)

// Config is every setting, with Defaults in one place.
type Config struct {
	// Env is "development" (the default) or "production" (APP_ENV). In
	// production serve refuses what is only safe on a developer's machine:
	// the in-process processor simulator (no money moves) and migrating on
	// start (the serving process would hold the owner's credentials).
	Env string
	// Addr is where the API listens (ADDR).
	Addr string
	// MetricsAddr is where /metrics is served, apart from the API so that
	// it is never exposed with it (METRICS_ADDR; "off" turns it off).
	MetricsAddr string
	// Pprof serves net/http/pprof on the metrics listener, for profiling
	// under load (PPROF). Off by default.
	Pprof bool
	// AdminPassword, when set, serves River UI at /riverui/ on the metrics
	// listener behind HTTP basic auth (user admin) with this password
	// (ADMIN_PASSWORD, at least 16 characters): the operator's view of the
	// outbox's queues. Unset, nothing is served there.
	AdminPassword string
	// DatabaseURL connects as the service role, which row-level security
	// applies to (DATABASE_URL).
	DatabaseURL string
	// MigrateDatabaseURL connects as the role that owns the tables; used for
	// migrations and the keys subcommands, never to serve requests
	// (MIGRATE_DATABASE_URL; by default DATABASE_URL as the user postgres).
	MigrateDatabaseURL string
	// MaintenanceDatabaseURL connects as payments_maintenance, the role that
	// may delete expired keys and nothing else (MAINTENANCE_DATABASE_URL; by
	// default DATABASE_URL as the user payments_maintenance).
	MaintenanceDatabaseURL string
	// MigrateOnStart applies pending migrations when serve starts, creating
	// the database first if it does not exist (MIGRATE_ON_START).
	MigrateOnStart bool
	// DBMaxConns is the service pool's size (DB_MAX_CONNS). Concurrent
	// duplicates of one key each hold a connection while they wait.
	DBMaxConns int32
	// DBAcquireTimeout bounds the wait for a pooled connection; past it the
	// request gets 503 (DB_ACQUIRE_TIMEOUT).
	DBAcquireTimeout time.Duration
	// LockTimeout bounds the wait for a concurrent request with the same
	// idempotency key; past it the request gets 409 (LOCK_TIMEOUT).
	LockTimeout time.Duration
	// DBIdleInTxTimeout ends a database session whose transaction has sat
	// idle this long (DB_IDLE_IN_TX_TIMEOUT): the bound on how long a key
	// stays locked after its holder vanished without closing its connection.
	DBIdleInTxTimeout time.Duration
	// DBCommitTimeout bounds a request's COMMIT, which the request cannot
	// cancel (DB_COMMIT_TIMEOUT; database.PoolConfig.CommitTimeout).
	DBCommitTimeout time.Duration
	// Processor names the processor's adapter (PROCESSOR): "http" for an
	// API of processor.Client's shape at ProcessorURL, or the in-process
	// simulator when that is empty; "stripe" for Stripe, set by Stripe.
	Processor string
	// ProcessorURL is the payment processor's API (PROCESSOR_URL). Empty runs
	// the simulator in process, on a loopback port.
	ProcessorURL string
	// Stripe configures PROCESSOR=stripe (STRIPE_*).
	Stripe StripeSettings
	// ProcessorTimeout bounds one processor call (PROCESSOR_TIMEOUT).
	ProcessorTimeout time.Duration
	// Sim configures the processor-sim subcommand's simulator
	// (PROCESSOR_SIM_*). serve refuses them: its in-process simulator never
	// misbehaves, and a production binary has no fault switches.
	Sim SimSettings
	// OutboxWorkers is how many outbox jobs (processor calls) run at once
	// (OUTBOX_WORKERS); 0 leaves the jobs to another process. A worker
	// mostly waits for the processor, holding no connection meanwhile, so
	// size it for the processor: at least the payment rate times one
	// charge's p99 time, the processor's latency plus the job's own work
	// (docs/external-effects.md, "Sizing the outbox").
	OutboxWorkers int
	// WebhookWorkers is how many webhook deliveries run at once
	// (WEBHOOK_WORKERS), in a queue apart from the processor's: a tenant's
	// slow receivers can hold these, never the workers that charge.
	WebhookWorkers int
	// OutboxDBMaxConns is the outbox's own pool (OUTBOX_DB_MAX_CONNS), apart
	// from the requests' so that a backlog never takes a request's
	// connection. A worker holds one only for its two short transactions,
	// never during the processor call, so it is sized by transaction time.
	OutboxDBMaxConns int32
	// WebhookDBMaxConns is the webhook deliveries' own pool
	// (WEBHOOK_DB_MAX_CONNS), apart from the charges': deliveries are
	// never money, so however many run they never take a connection a
	// charge is waiting for, and their share of the database is bounded.
	WebhookDBMaxConns int32
	// OutboxJobTimeout bounds one attempt of a job; OutboxRescueAfter (longer)
	// is when the job of a worker that died runs again (OUTBOX_JOB_TIMEOUT,
	// OUTBOX_RESCUE_AFTER).
	OutboxJobTimeout  time.Duration
	OutboxRescueAfter time.Duration
	// OutboxMaxAttempts is a job's retry budget (OUTBOX_MAX_ATTEMPTS); the
	// backoff between attempts grows from OutboxRetryBase to OutboxRetryMax
	// (OUTBOX_RETRY_BASE, OUTBOX_RETRY_MAX).
	OutboxMaxAttempts int
	OutboxRetryBase   time.Duration
	OutboxRetryMax    time.Duration
	// ProcessorKeyWindow is how long the processor remembers an idempotency
	// key (PROCESSOR_KEY_WINDOW; Stripe: 24 h). A retry after it could charge
	// a second time, so the outbox's whole retry schedule must end inside it.
	ProcessorKeyWindow time.Duration
	// ReconcileInterval is how often the reconciler settles payments and
	// refunds left undecided (RECONCILE_INTERVAL); ReconcileGrace is how long
	// a row's job must have ended before it is looked up at the processor
	// (RECONCILE_GRACE), longer than PROCESSOR_TIMEOUT so that no call of
	// the job can still arrive.
	ReconcileInterval time.Duration
	ReconcileGrace    time.Duration
	// IdempotencyWindow is the published retry window (IDEMPOTENCY_WINDOW).
	IdempotencyWindow time.Duration
	// IdempotencyMargin is kept beyond the window before a key may be
	// deleted, so clocks and slow retries never cut the promise short
	// (IDEMPOTENCY_MARGIN).
	IdempotencyMargin time.Duration
	// MaxBodyBytes bounds request bodies; larger ones get 413 (MAX_BODY_BYTES).
	MaxBodyBytes int64
	// MaxStoredResponseBytes caps a stored response body; a larger one is
	// stored as a reference and re-derived on replay
	// (MAX_STORED_RESPONSE_BYTES).
	MaxStoredResponseBytes int
	// KeyQuota is the most live idempotency keys per principal; 0 turns
	// the quota off (IDEMPOTENCY_KEY_QUOTA).
	KeyQuota int64
	// RateLimit is the most requests a second of one principal, in this
	// process (RATE_LIMIT); RateLimitUnauthenticated the most of one client
	// address before its key is known here (RATE_LIMIT_UNAUTHENTICATED).
	// 0 turns either off.
	RateLimit                int
	RateLimitUnauthenticated int
	// QuotaRefresh is how long a principal's key count is cached and how
	// often claim counts are flushed (IDEMPOTENCY_QUOTA_REFRESH).
	QuotaRefresh time.Duration
	// SweepInterval is how often the in-service sweeper runs; 0 turns it
	// off, for deployments that run `api sweep` from cron (SWEEP_INTERVAL).
	SweepInterval time.Duration
	// SweepChunk is the most rows one sweep DELETE removes (SWEEP_CHUNK).
	SweepChunk int
	// SweepPause is the wait between chunks (SWEEP_PAUSE).
	SweepPause time.Duration
	// RequestTimeout bounds a whole request, database work included
	// (REQUEST_TIMEOUT).
	RequestTimeout time.Duration
	// BodyTimeout bounds reading a request, headers and body, from its first
	// byte (BODY_TIMEOUT; the server's ReadTimeout). It is shorter than
	// RequestTimeout, and the write deadline is RequestTimeout + 5 s, so a
	// body that arrives too slowly gets its 408 on the wire while the request
	// still has time left to answer.
	BodyTimeout time.Duration
	// WebhookSigningKey derives every webhook endpoint's signing secret
	// (WEBHOOK_SIGNING_KEY, base64, at least 32 bytes). Required in
	// production; development uses DevelopmentWebhookKey. Changing it
	// changes every endpoint's secret: rotate each endpoint's instead.
	WebhookSigningKey []byte
	// WebhookAllowPrivateURLs lets webhook endpoints use http and loopback,
	// private or link-local addresses (WEBHOOK_ALLOW_PRIVATE_URLS): a
	// receiver on a developer's machine. On by default in development;
	// production refuses it (server-side request forgery).
	WebhookAllowPrivateURLs bool
	// WebhookTimeout bounds one delivery attempt (WEBHOOK_TIMEOUT).
	WebhookTimeout time.Duration
	// WebhookEndpointConcurrency is the most delivery attempts to one
	// endpoint that run at once, across every instance
	// (WEBHOOK_ENDPOINT_CONCURRENCY; 0: no bound): one tenant's slow
	// receiver holds that many of the webhook workers, not all of them.
	WebhookEndpointConcurrency int
	// WebhookDisableAfter disables an endpoint whose every attempt has
	// failed for this long, and tells its owner with a
	// webhook_endpoint.disabled event (WEBHOOK_DISABLE_AFTER; 0: never).
	WebhookDisableAfter time.Duration
	// WebhookSchedule is when each delivery attempt is made after the
	// previous failed; its length is the attempts (WEBHOOK_RETRY_SCHEDULE).
	// The default is the Standard Webhooks specification's example: eight
	// attempts over about 28 hours; a receiver down for longer misses the
	// event (it stays listable in GET /v1/events for 30 days).
	WebhookSchedule []time.Duration
	// ShutdownTimeout bounds graceful shutdown after SIGTERM (SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error (LOG_LEVEL).
	LogLevel slog.Level
}

// Defaults returns the configuration used when no variable is set.
func Defaults() Config {
	return Config{
		Env:                        EnvDevelopment,
		Addr:                       ":8080",
		MetricsAddr:                ":9090",
		DatabaseURL:                "postgres://payments_app@127.0.0.1:5432/payments?sslmode=disable",
		MigrateDatabaseURL:         "postgres://postgres@127.0.0.1:5432/payments?sslmode=disable",
		MaintenanceDatabaseURL:     "postgres://payments_maintenance@127.0.0.1:5432/payments?sslmode=disable",
		MigrateOnStart:             true,
		DBMaxConns:                 32,
		DBAcquireTimeout:           2 * time.Second,
		LockTimeout:                5 * time.Second,
		DBIdleInTxTimeout:          10 * time.Second,
		DBCommitTimeout:            3 * time.Second,
		Processor:                  ProcessorHTTP,
		ProcessorTimeout:           10 * time.Second,
		Stripe:                     StripeSettings{PaymentMethod: StripeTestPaymentMethod},
		OutboxWorkers:              400,
		WebhookWorkers:             200,
		OutboxDBMaxConns:           16,
		WebhookDBMaxConns:          4,
		OutboxJobTimeout:           30 * time.Second,
		OutboxRescueAfter:          2 * time.Minute,
		OutboxMaxAttempts:          15,
		OutboxRetryBase:            time.Second,
		OutboxRetryMax:             10 * time.Minute,
		ProcessorKeyWindow:         24 * time.Hour,
		ReconcileInterval:          time.Minute,
		ReconcileGrace:             2 * time.Minute,
		IdempotencyWindow:          24 * time.Hour,
		IdempotencyMargin:          time.Hour,
		MaxBodyBytes:               1 << 20,
		MaxStoredResponseBytes:     64 << 10,
		KeyQuota:                   1_000_000,
		RateLimit:                  100,
		RateLimitUnauthenticated:   20,
		QuotaRefresh:               5 * time.Second,
		SweepInterval:              time.Minute,
		SweepChunk:                 1000,
		SweepPause:                 50 * time.Millisecond,
		RequestTimeout:             15 * time.Second,
		BodyTimeout:                10 * time.Second,
		ShutdownTimeout:            20 * time.Second,
		LogLevel:                   slog.LevelInfo,
		WebhookSigningKey:          DevelopmentWebhookKey,
		WebhookAllowPrivateURLs:    true, // development: a receiver on this machine
		WebhookTimeout:             10 * time.Second,
		WebhookEndpointConcurrency: 8,
		WebhookDisableAfter:        5 * 24 * time.Hour,
		WebhookSchedule: []time.Duration{0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute,
			2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour},
	}
}

// DevelopmentWebhookKey is the webhook signing key of development, when
// WEBHOOK_SIGNING_KEY is unset: published here, so anyone can derive its
// secrets. Production refuses to run without a key of its own.
var DevelopmentWebhookKey = []byte("development webhook key: set WEBHOOK_SIGNING_KEY!")

// Load reads the environment through getenv (os.Getenv in production) on top
// of Defaults and validates the result. The error names every bad variable.
func Load(getenv func(string) string) (Config, error) {
	c := Defaults()
	var errs []error
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	dur := func(name string, dst *time.Duration, min time.Duration) {
		v := getenv(name)
		if v == "" {
			return
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < min {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration of at least %s, like 5s or 24h", name, v, min))
			return
		}
		*dst = d
	}
	integer := func(name string, min, max int64, set func(int64)) {
		v := getenv(name)
		if v == "" {
			return
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < min || n > max {
			errs = append(errs, fmt.Errorf("%s=%q: want an integer from %d to %d", name, v, min, max))
			return
		}
		set(n)
	}
	rate := func(name string, dst *float64) {
		v := getenv(name)
		if v == "" {
			return
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a probability from 0 to 1", name, v))
			return
		}
		*dst = f
	}
	boolean := func(name string, dst *bool) {
		v := getenv(name)
		if v == "" {
			return
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", name, v))
			return
		}
		*dst = b
	}

	str("APP_ENV", &c.Env)
	switch c.Env {
	case EnvDevelopment:
	case EnvProduction:
		c.MigrateOnStart = false // migrations are their own step: `api migrate up`
		c.WebhookAllowPrivateURLs = false
	default:
		errs = append(errs, fmt.Errorf("APP_ENV=%q: want development or production", c.Env))
	}
	str("ADDR", &c.Addr)
	str("METRICS_ADDR", &c.MetricsAddr)
	boolean("PPROF", &c.Pprof)
	str("ADMIN_PASSWORD", &c.AdminPassword)
	str("DATABASE_URL", &c.DatabaseURL)
	// One setting names the database: unset, the owner's and the
	// maintenance role's URLs are DATABASE_URL with their own user, so
	// pointing DATABASE_URL elsewhere moves all three together.
	if getenv("DATABASE_URL") != "" {
		c.MigrateDatabaseURL = database.WithUser(c.DatabaseURL, "postgres")
		c.MaintenanceDatabaseURL = database.WithUser(c.DatabaseURL, "payments_maintenance")
	}
	str("MIGRATE_DATABASE_URL", &c.MigrateDatabaseURL)
	str("MAINTENANCE_DATABASE_URL", &c.MaintenanceDatabaseURL)
	boolean("MIGRATE_ON_START", &c.MigrateOnStart)
	integer("DB_MAX_CONNS", 1, 1000, func(n int64) { c.DBMaxConns = int32(n) })
	dur("DB_ACQUIRE_TIMEOUT", &c.DBAcquireTimeout, time.Millisecond)
	dur("LOCK_TIMEOUT", &c.LockTimeout, time.Millisecond)
	dur("DB_IDLE_IN_TX_TIMEOUT", &c.DBIdleInTxTimeout, 100*time.Millisecond)
	dur("DB_COMMIT_TIMEOUT", &c.DBCommitTimeout, 100*time.Millisecond)
	if c.DBCommitTimeout >= 5*time.Second {
		errs = append(errs, errors.New("DB_COMMIT_TIMEOUT must be under 5s: the response must still be written after it (REQUEST_TIMEOUT + 5s)"))
	}
	str("PROCESSOR", &c.Processor)
	str("PROCESSOR_URL", &c.ProcessorURL)
	str("STRIPE_SECRET_KEY", &c.Stripe.SecretKey)
	str("STRIPE_API_URL", &c.Stripe.URL)
	str("STRIPE_PAYMENT_METHOD", &c.Stripe.PaymentMethod)
	dur("PROCESSOR_TIMEOUT", &c.ProcessorTimeout, time.Millisecond)
	dur("PROCESSOR_SIM_LATENCY", &c.Sim.Latency, 0)
	rate("PROCESSOR_SIM_ERROR_RATE", &c.Sim.ErrorRate)
	rate("PROCESSOR_SIM_DROP_RATE", &c.Sim.DropRate)
	rate("PROCESSOR_SIM_TIMEOUT_RATE", &c.Sim.TimeoutRate)
	dur("PROCESSOR_SIM_HOLD", &c.Sim.Hold, 0)
	dur("PROCESSOR_SIM_COMMIT_DELAY", &c.Sim.CommitDelay, 0)
	integer("OUTBOX_WORKERS", 0, 10000, func(n int64) { c.OutboxWorkers = int(n) })
	integer("WEBHOOK_WORKERS", 0, 10000, func(n int64) { c.WebhookWorkers = int(n) })
	integer("OUTBOX_DB_MAX_CONNS", 1, 1000, func(n int64) { c.OutboxDBMaxConns = int32(n) })
	integer("WEBHOOK_DB_MAX_CONNS", 1, 1000, func(n int64) { c.WebhookDBMaxConns = int32(n) })
	dur("OUTBOX_JOB_TIMEOUT", &c.OutboxJobTimeout, time.Second)
	dur("OUTBOX_RESCUE_AFTER", &c.OutboxRescueAfter, time.Second)
	integer("OUTBOX_MAX_ATTEMPTS", 1, 100, func(n int64) { c.OutboxMaxAttempts = int(n) })
	dur("OUTBOX_RETRY_BASE", &c.OutboxRetryBase, time.Millisecond)
	dur("OUTBOX_RETRY_MAX", &c.OutboxRetryMax, time.Millisecond)
	dur("PROCESSOR_KEY_WINDOW", &c.ProcessorKeyWindow, time.Minute)
	dur("RECONCILE_INTERVAL", &c.ReconcileInterval, time.Second)
	dur("RECONCILE_GRACE", &c.ReconcileGrace, time.Second)
	dur("IDEMPOTENCY_WINDOW", &c.IdempotencyWindow, time.Minute)
	dur("IDEMPOTENCY_MARGIN", &c.IdempotencyMargin, 0)
	integer("MAX_BODY_BYTES", 1024, 64<<20, func(n int64) { c.MaxBodyBytes = n })
	integer("MAX_STORED_RESPONSE_BYTES", 1, 16<<20, func(n int64) { c.MaxStoredResponseBytes = int(n) })
	integer("IDEMPOTENCY_KEY_QUOTA", 0, 1<<50, func(n int64) { c.KeyQuota = n })
	integer("RATE_LIMIT", 0, 1_000_000, func(n int64) { c.RateLimit = int(n) })
	integer("RATE_LIMIT_UNAUTHENTICATED", 0, 1_000_000, func(n int64) { c.RateLimitUnauthenticated = int(n) })
	dur("IDEMPOTENCY_QUOTA_REFRESH", &c.QuotaRefresh, 100*time.Millisecond)
	dur("SWEEP_INTERVAL", &c.SweepInterval, 0)
	integer("SWEEP_CHUNK", 1, 100_000, func(n int64) { c.SweepChunk = int(n) })
	dur("SWEEP_PAUSE", &c.SweepPause, 0)
	dur("REQUEST_TIMEOUT", &c.RequestTimeout, time.Second)
	dur("BODY_TIMEOUT", &c.BodyTimeout, 100*time.Millisecond)
	if getenv("BODY_TIMEOUT") == "" && c.BodyTimeout >= c.RequestTimeout {
		// A short REQUEST_TIMEOUT alone (the fault suite's 1 s) keeps the
		// order read < request: the body gets two thirds of it.
		c.BodyTimeout = c.RequestTimeout * 2 / 3
	}
	dur("SHUTDOWN_TIMEOUT", &c.ShutdownTimeout, time.Second)
	if v := getenv("WEBHOOK_SIGNING_KEY"); v != "" {
		key, err := base64.StdEncoding.DecodeString(v)
		if err != nil || len(key) < 32 {
			errs = append(errs, errors.New("WEBHOOK_SIGNING_KEY: want the standard base64 of at least 32 random bytes, like the output of `openssl rand -base64 32`"))
		}
		c.WebhookSigningKey = key
	}
	boolean("WEBHOOK_ALLOW_PRIVATE_URLS", &c.WebhookAllowPrivateURLs)
	dur("WEBHOOK_TIMEOUT", &c.WebhookTimeout, 100*time.Millisecond)
	integer("WEBHOOK_ENDPOINT_CONCURRENCY", 0, 10000, func(n int64) { c.WebhookEndpointConcurrency = int(n) })
	dur("WEBHOOK_DISABLE_AFTER", &c.WebhookDisableAfter, 0)
	if v := getenv("WEBHOOK_RETRY_SCHEDULE"); v != "" {
		var schedule []time.Duration
		for part := range strings.SplitSeq(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(part))
			if err != nil || d < 0 {
				schedule = nil
				break
			}
			schedule = append(schedule, d)
		}
		if len(schedule) == 0 || len(schedule) > 20 {
			errs = append(errs, fmt.Errorf("WEBHOOK_RETRY_SCHEDULE=%q: want 1 to 20 comma-separated durations, like 0s,5s,5m", v))
		} else {
			c.WebhookSchedule = schedule
		}
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	// When both are set, they must agree. (A lone MAINTENANCE_DATABASE_URL,
	// for a cron's `api sweep`, says nothing about the service's database.)
	served := databaseName(c.DatabaseURL)
	for name, u := range map[string]string{"DATABASE_URL": c.DatabaseURL, "MIGRATE_DATABASE_URL": c.MigrateDatabaseURL, "MAINTENANCE_DATABASE_URL": c.MaintenanceDatabaseURL} {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
			errs = append(errs, fmt.Errorf("%s: want a postgres:// URL", name))
		} else if db := databaseName(u); db != served && getenv("DATABASE_URL") != "" && getenv(name) != "" {
			// keys create would write keys where the service never looks,
			// and every request would get 401.
			errs = append(errs, fmt.Errorf("%s names the database %q, DATABASE_URL %q: all three roles must use the database the service serves (leave %s unset to derive it from DATABASE_URL)", name, db, served, name))
		}
	}
	if c.AdminPassword != "" && len(c.AdminPassword) < 16 {
		errs = append(errs, errors.New("ADMIN_PASSWORD must be at least 16 characters (openssl rand -base64 24): it guards River UI, which can cancel and delete jobs"))
	}
	if c.AdminPassword != "" && c.MetricsAddr == "off" {
		errs = append(errs, errors.New("ADMIN_PASSWORD serves River UI on the metrics listener, and METRICS_ADDR is off"))
	}
	if c.MetricsAddr == c.Addr {
		errs = append(errs, fmt.Errorf("METRICS_ADDR must differ from ADDR (%s): metrics are never served with the API", c.Addr))
	}
	if published, err := idempotentpayments.PublishedWindow(); err != nil {
		errs = append(errs, err)
	} else if c.IdempotencyWindow < published {
		errs = append(errs, fmt.Errorf("IDEMPOTENCY_WINDOW=%s is shorter than the %s that openapi.yaml promises clients (x-idempotency.window-seconds); change both together", c.IdempotencyWindow, published))
	}
	if c.OutboxRescueAfter <= c.OutboxJobTimeout {
		errs = append(errs, fmt.Errorf("OUTBOX_RESCUE_AFTER (%s) must be longer than OUTBOX_JOB_TIMEOUT (%s), or running jobs would run twice at once", c.OutboxRescueAfter, c.OutboxJobTimeout))
	}
	if c.ProcessorTimeout >= c.OutboxJobTimeout {
		errs = append(errs, fmt.Errorf("PROCESSOR_TIMEOUT (%s) must be shorter than OUTBOX_JOB_TIMEOUT (%s)", c.ProcessorTimeout, c.OutboxJobTimeout))
	}
	if c.ReconcileGrace <= c.ProcessorTimeout {
		errs = append(errs, fmt.Errorf("RECONCILE_GRACE (%s) must be longer than PROCESSOR_TIMEOUT (%s): a call still on its way could charge after the reconciler recorded \"no record\"", c.ReconcileGrace, c.ProcessorTimeout))
	}
	if last := c.RetrySchedule(); last >= c.ProcessorKeyWindow {
		errs = append(errs, fmt.Errorf("the outbox's retry schedule can last %s (OUTBOX_MAX_ATTEMPTS=%d, OUTBOX_RETRY_BASE=%s, OUTBOX_RETRY_MAX=%s, OUTBOX_RESCUE_AFTER=%s), not inside PROCESSOR_KEY_WINDOW=%s: a late retry could charge twice once the processor forgets the key",
			last.Round(time.Second), c.OutboxMaxAttempts, c.OutboxRetryBase, c.OutboxRetryMax, c.OutboxRescueAfter, c.ProcessorKeyWindow))
	}
	switch c.Processor {
	case ProcessorHTTP:
		if c.Stripe.SecretKey != "" {
			errs = append(errs, errors.New("STRIPE_SECRET_KEY is set but PROCESSOR is not stripe: set PROCESSOR=stripe to charge through Stripe"))
		}
	case ProcessorStripe:
		errs = append(errs, c.Stripe.check(c.ProcessorURL, c.ReconcileGrace)...)
	default:
		errs = append(errs, fmt.Errorf("PROCESSOR=%q: want http or stripe", c.Processor))
	}
	if c.Env == EnvProduction {
		if c.Simulated() {
			errs = append(errs, errors.New("APP_ENV=production needs PROCESSOR_URL or PROCESSOR=stripe: without either the service charges the in-process simulator, which moves no money and succeeds every charge"))
		}
		if c.MigrateOnStart {
			errs = append(errs, errors.New("APP_ENV=production refuses MIGRATE_ON_START=true: the serving process would hold the owner's credentials; run `api migrate up` as its own step"))
		}
		if getenv("WEBHOOK_SIGNING_KEY") == "" {
			errs = append(errs, errors.New("APP_ENV=production needs WEBHOOK_SIGNING_KEY: without it every webhook secret is derived from the development key, which is published"))
		}
		if c.WebhookAllowPrivateURLs {
			errs = append(errs, errors.New("APP_ENV=production refuses WEBHOOK_ALLOW_PRIVATE_URLS=true: a client could point a webhook at the service's own network (server-side request forgery)"))
		}
	}
	if c.BodyTimeout >= c.RequestTimeout {
		errs = append(errs, fmt.Errorf("BODY_TIMEOUT (%s) must be shorter than REQUEST_TIMEOUT (%s): a body that arrives too slowly must still get its 408 before the request's own deadline", c.BodyTimeout, c.RequestTimeout))
	}
	if c.LockTimeout >= c.RequestTimeout {
		errs = append(errs, fmt.Errorf("LOCK_TIMEOUT (%s) must be shorter than REQUEST_TIMEOUT (%s)", c.LockTimeout, c.RequestTimeout))
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("invalid configuration: %w", errors.Join(errs...))
	}
	return c, nil
}

// The values of APP_ENV.
const (
	EnvDevelopment = "development"
	EnvProduction  = "production"
)

// The values of PROCESSOR.
const (
	ProcessorHTTP   = "http"
	ProcessorStripe = "stripe"
)

// Simulated reports whether payments are charged through the in-process
// simulator: no processor is configured.
func (c Config) Simulated() bool { return c.Processor == ProcessorHTTP && c.ProcessorURL == "" }

// Livemode reports whether payments move real money: through a processor
// at PROCESSOR_URL, or through Stripe with a live key. The in-process
// simulator and Stripe's test mode are test mode.
func (c Config) Livemode() bool {
	if c.Processor == ProcessorStripe {
		return c.Stripe.Live()
	}
	return c.ProcessorURL != ""
}

// StripeTestPaymentMethod is the payment method charged by default: Stripe's
// test Visa card, which exists only in test mode.
const StripeTestPaymentMethod = "pm_card_visa"

// StripeSearchLag is the least RECONCILE_GRACE with PROCESSOR=stripe: the
// reconciler finds a charge through Stripe's search, whose index lags its
// writes (under a minute, Stripe says, in normal operation), and a charge
// not indexed yet must not read as "no record".
const StripeSearchLag = 5 * time.Minute

// StripeSettings configure the Stripe adapter (internal/processor/stripe).
type StripeSettings struct {
	// SecretKey is the API key (STRIPE_SECRET_KEY): sk_test_ or rk_test_
	// for test mode, sk_live_ or rk_live_ to move money. Never logged.
	SecretKey string
	// URL is Stripe's API (STRIPE_API_URL); empty is Stripe's own, and
	// stripe-mock is another.
	URL string
	// PaymentMethod is charged for every payment (STRIPE_PAYMENT_METHOD):
	// this API takes no card (docs/external-effects.md, "Stripe").
	PaymentMethod string
}

// Live reports whether the key moves real money.
func (s StripeSettings) Live() bool {
	return strings.HasPrefix(s.SecretKey, "sk_live_") || strings.HasPrefix(s.SecretKey, "rk_live_")
}

// check returns what is wrong with PROCESSOR=stripe's settings.
func (s StripeSettings) check(processorURL string, reconcileGrace time.Duration) []error {
	var errs []error
	if s.SecretKey == "" {
		errs = append(errs, errors.New("PROCESSOR=stripe needs STRIPE_SECRET_KEY"))
	}
	if processorURL != "" {
		errs = append(errs, errors.New("PROCESSOR=stripe and PROCESSOR_URL are both set: pick one processor (STRIPE_API_URL points the Stripe adapter elsewhere)"))
	}
	if s.PaymentMethod == "" {
		errs = append(errs, errors.New("PROCESSOR=stripe needs STRIPE_PAYMENT_METHOD"))
	}
	if s.Live() && s.PaymentMethod == StripeTestPaymentMethod {
		errs = append(errs, fmt.Errorf("a live STRIPE_SECRET_KEY with STRIPE_PAYMENT_METHOD=%s, Stripe's test card: a live account charges its own customers' payment methods (docs/external-effects.md, \"Stripe\")", StripeTestPaymentMethod))
	}
	if reconcileGrace < StripeSearchLag {
		errs = append(errs, fmt.Errorf("PROCESSOR=stripe needs RECONCILE_GRACE of at least %s (it is %s): the reconciler finds charges through Stripe's search, which lags Stripe's writes, and an unindexed charge must not read as \"no record\"", StripeSearchLag, reconcileGrace))
	}
	return errs
}

// SimSettings are the processor simulator's switches: latency before a call
// is processed, and the share of calls that fail (503, no charge), are
// charged and then dropped without a reply, or are charged and answered only
// after Hold; and CommitDelay, how long after its arrival a call is
// processed, whether or not its caller still waits.
type SimSettings struct {
	Latency     time.Duration
	CommitDelay time.Duration
	ErrorRate   float64
	DropRate    float64
	TimeoutRate float64
	Hold        time.Duration
}

// RetrySchedule is the longest time from a job's first processor call to its
// last: every backoff at its ceiling (RetryBase doubling up to RetryMax), and
// every attempt as long as it can be, OutboxRescueAfter, as when its worker
// died. The last call must reach the processor while it still remembers the
// first one's key.
func (c Config) RetrySchedule() time.Duration {
	total := time.Duration(c.OutboxMaxAttempts) * c.OutboxRescueAfter
	d := c.OutboxRetryBase
	for range c.OutboxMaxAttempts - 1 {
		total += min(d, c.OutboxRetryMax)
		if d < c.OutboxRetryMax {
			d *= 2
		}
	}
	return total
}

// Retention is how long a key row is kept: the window plus the margin.
func (c Config) Retention() time.Duration { return c.IdempotencyWindow + c.IdempotencyMargin }

// LogAttrs returns the settings as log attributes, with passwords masked.
func (c Config) LogAttrs() []any {
	return []any{
		slog.String("app_env", c.Env),
		slog.Bool("livemode", c.Livemode()),
		slog.String("addr", c.Addr),
		slog.String("metrics_addr", c.MetricsAddr),
		slog.Bool("admin_password_set", c.AdminPassword != ""),
		slog.String("database_url", redact(c.DatabaseURL)),
		slog.String("migrate_database_url", redact(c.MigrateDatabaseURL)),
		slog.String("maintenance_database_url", redact(c.MaintenanceDatabaseURL)),
		slog.Bool("migrate_on_start", c.MigrateOnStart),
		slog.Int("db_max_conns", int(c.DBMaxConns)),
		slog.String("db_acquire_timeout", c.DBAcquireTimeout.String()),
		slog.String("lock_timeout", c.LockTimeout.String()),
		slog.String("db_idle_in_tx_timeout", c.DBIdleInTxTimeout.String()),
		slog.String("idempotency_window", c.IdempotencyWindow.String()),
		slog.String("idempotency_margin", c.IdempotencyMargin.String()),
		slog.Int64("max_body_bytes", c.MaxBodyBytes),
		slog.Int("max_stored_response_bytes", c.MaxStoredResponseBytes),
		slog.Int64("idempotency_key_quota", c.KeyQuota),
		slog.String("sweep_interval", c.SweepInterval.String()),
		slog.String("request_timeout", c.RequestTimeout.String()),
		slog.String("body_timeout", c.BodyTimeout.String()),
		slog.String("processor", c.Processor),
		slog.String("processor_url", redact(c.ProcessorURL)),
		slog.Int("outbox_workers", c.OutboxWorkers),
		slog.Int("webhook_workers", c.WebhookWorkers),
		slog.Int("outbox_db_max_conns", int(c.OutboxDBMaxConns)),
		slog.Int("webhook_db_max_conns", int(c.WebhookDBMaxConns)),
		slog.String("outbox_retry_schedule", c.RetrySchedule().Round(time.Second).String()),
		slog.String("processor_key_window", c.ProcessorKeyWindow.String()),
		slog.String("reconcile_interval", c.ReconcileInterval.String()),
		slog.Bool("webhook_allow_private_urls", c.WebhookAllowPrivateURLs),
		slog.String("webhook_timeout", c.WebhookTimeout.String()),
		slog.Int("webhook_endpoint_concurrency", c.WebhookEndpointConcurrency),
		slog.String("webhook_disable_after", c.WebhookDisableAfter.String()),
		slog.String("webhook_retry_schedule", formatSchedule(c.WebhookSchedule)),
	}
}

// formatSchedule writes a delivery schedule as WEBHOOK_RETRY_SCHEDULE takes it.
func formatSchedule(schedule []time.Duration) string {
	parts := make([]string, len(schedule))
	for i, d := range schedule {
		parts[i] = duration(d)
	}
	return strings.Join(parts, ",")
}

// databaseName is the database a postgres URL names.
func databaseName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// redact masks the password of a URL; a URL that does not parse is hidden
// whole, since it may hold a password where the parser did not expect one.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}
