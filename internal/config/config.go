// Package config reads the service's settings from the environment. Every
// setting has a default that works on a developer machine with PostgreSQL on
// localhost; Load refuses values that make no sense instead of guessing.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
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
	Env string `env:"APP_ENV" default:"development" help:"development or production (refuses the simulator and migrating on start)"`
	// Addr is where the API listens (ADDR).
	Addr string `env:"ADDR" default:":8080" help:"the API's listen address"`
	// MetricsAddr is where /metrics is served, apart from the API so that
	// it is never exposed with it (METRICS_ADDR; "off" turns it off).
	MetricsAddr string `env:"METRICS_ADDR" default:":9090" help:"the /metrics listener, apart from the API (off disables it)"`
	// Pprof serves net/http/pprof on the metrics listener, for profiling
	// under load (PPROF). Off by default.
	Pprof bool `env:"PPROF" default:"false" help:"serve /debug/pprof/ on the metrics listener"`
	// AdminPassword, when set, serves River UI at /riverui/ on the metrics
	// listener behind HTTP basic auth (user admin) with this password
	// (ADMIN_PASSWORD, at least 16 characters): the operator's view of the
	// outbox's queues. Unset, nothing is served there.
	AdminPassword string `env:"ADMIN_PASSWORD" default:"" secret:"true" help:"serve River UI at /riverui/ on the metrics listener, behind basic auth (user admin); at least 16 characters; unset: not served"`
	// DatabaseURL connects as the service role, which row-level security
	// applies to (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL" default:"postgres://payments_app@127.0.0.1:5432/payments?sslmode=disable" log:"redact" help:"the service role's database; names the database for every role"`
	// MigrateDatabaseURL connects as the role that owns the tables; used for
	// migrations and the keys subcommands, never to serve requests
	// (MIGRATE_DATABASE_URL; by default DATABASE_URL as the user postgres).
	MigrateDatabaseURL string `env:"MIGRATE_DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/payments?sslmode=disable" log:"redact" help:"the owner role (migrations, keys); default: DATABASE_URL as postgres"`
	// MaintenanceDatabaseURL connects as payments_maintenance, the role that
	// may delete expired keys and nothing else (MAINTENANCE_DATABASE_URL; by
	// default DATABASE_URL as the user payments_maintenance).
	MaintenanceDatabaseURL string `env:"MAINTENANCE_DATABASE_URL" default:"postgres://payments_maintenance@127.0.0.1:5432/payments?sslmode=disable" log:"redact" help:"the sweeper's role; default: DATABASE_URL as payments_maintenance"`
	// MigrateOnStart applies pending migrations when serve starts, creating
	// the database first if it does not exist (MIGRATE_ON_START).
	MigrateOnStart bool `env:"MIGRATE_ON_START" default:"true" help:"serve creates the database and migrates (false with APP_ENV=production)"`
	// DBMaxConns is the service pool's size (DB_MAX_CONNS). Concurrent
	// duplicates of one key each hold a connection while they wait.
	DBMaxConns int32 `env:"DB_MAX_CONNS" default:"32" min:"1" max:"1000" help:"the service pool's size"`
	// DBAcquireTimeout bounds the wait for a pooled connection; past it the
	// request gets 503 (DB_ACQUIRE_TIMEOUT).
	DBAcquireTimeout time.Duration `env:"DB_ACQUIRE_TIMEOUT" default:"2s" min:"1ms" help:"longest wait for a pooled connection, then 503"`
	// LockTimeout bounds the wait for a concurrent request with the same
	// idempotency key; past it the request gets 409 (LOCK_TIMEOUT).
	LockTimeout time.Duration `env:"LOCK_TIMEOUT" default:"5s" min:"1ms" help:"longest wait for a concurrent request with the same key, then 409"`
	// DBIdleInTxTimeout ends a database session whose transaction has sat
	// idle this long (DB_IDLE_IN_TX_TIMEOUT): the bound on how long a key
	// stays locked after its holder vanished without closing its connection.
	DBIdleInTxTimeout time.Duration `env:"DB_IDLE_IN_TX_TIMEOUT" default:"10s" min:"100ms" help:"the server ends a session idle in a transaction this long"`
	// DBCommitTimeout bounds a request's COMMIT, which the request cannot
	// cancel (DB_COMMIT_TIMEOUT; database.PoolConfig.CommitTimeout).
	DBCommitTimeout time.Duration `env:"DB_COMMIT_TIMEOUT" default:"3s" min:"100ms" help:"bound on a request's COMMIT, which neither the client nor REQUEST_TIMEOUT cancels (under 5s)"`
	// Processor names the processor's adapter (PROCESSOR): "http" for an
	// API of processor.Client's shape at ProcessorURL, or the in-process
	// simulator when that is empty; "stripe" for Stripe, set by Stripe.
	Processor string `env:"PROCESSOR" default:"http" help:"the processor's adapter: http (PROCESSOR_URL) or stripe (STRIPE_*)"`
	// ProcessorURL is the payment processor's API (PROCESSOR_URL). Empty runs
	// the simulator in process, on a loopback port.
	ProcessorURL string `env:"PROCESSOR_URL" default:"" log:"redact" help:"PROCESSOR=http: the payment processor; empty: the in-process simulator (test mode)"`
	// Stripe configures PROCESSOR=stripe (STRIPE_*).
	Stripe StripeSettings
	// ProcessorTimeout bounds one processor call (PROCESSOR_TIMEOUT).
	ProcessorTimeout time.Duration `env:"PROCESSOR_TIMEOUT" default:"10s" min:"1ms" help:"bound on one processor call"`
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
	OutboxWorkers int `env:"OUTBOX_WORKERS" default:"400" min:"0" max:"10000" help:"processor jobs worked at once (0: leave them to others); at least payments/s x one charge's p99 time (the processor's latency plus the job's own work)"`
	// WebhookWorkers is how many webhook deliveries run at once
	// (WEBHOOK_WORKERS), in a queue apart from the processor's: a tenant's
	// slow receivers can hold these, never the workers that charge.
	WebhookWorkers int `env:"WEBHOOK_WORKERS" default:"200" min:"0" max:"10000" help:"webhook deliveries worked at once, in a queue apart from the processor jobs (0: leave them to others); at least deliveries/s x a receiver's p99 time"`
	// OutboxDBMaxConns is the outbox's own pool (OUTBOX_DB_MAX_CONNS), apart
	// from the requests' so that a backlog never takes a request's
	// connection. A worker holds one only for its two short transactions,
	// never during the processor call, so it is sized by transaction time.
	OutboxDBMaxConns int32 `env:"OUTBOX_DB_MAX_CONNS" default:"16" min:"1" max:"1000" help:"the outbox's own pool; workers hold a connection only for their short transactions"`
	// WebhookDBMaxConns is the webhook deliveries' own pool
	// (WEBHOOK_DB_MAX_CONNS), apart from the charges': deliveries are
	// never money, so however many run they never take a connection a
	// charge is waiting for, and their share of the database is bounded.
	WebhookDBMaxConns int32 `env:"WEBHOOK_DB_MAX_CONNS" default:"4" min:"1" max:"1000" help:"the webhook deliveries' own pool, apart from the charges': deliveries never take a charge's connection"`
	// OutboxJobTimeout bounds one attempt of a job; OutboxRescueAfter (longer)
	// is when the job of a worker that died runs again (OUTBOX_JOB_TIMEOUT,
	// OUTBOX_RESCUE_AFTER).
	OutboxJobTimeout  time.Duration `env:"OUTBOX_JOB_TIMEOUT" default:"30s" min:"1s" help:"bound on one attempt of a job"`
	OutboxRescueAfter time.Duration `env:"OUTBOX_RESCUE_AFTER" default:"2m" min:"1s" help:"a dead worker's job runs again after this"`
	// OutboxMaxAttempts is a job's retry budget (OUTBOX_MAX_ATTEMPTS); the
	// backoff between attempts grows from OutboxRetryBase to OutboxRetryMax
	// (OUTBOX_RETRY_BASE, OUTBOX_RETRY_MAX).
	OutboxMaxAttempts int           `env:"OUTBOX_MAX_ATTEMPTS" default:"15" min:"1" max:"100" help:"a job's retry budget; then requires_reconciliation"`
	OutboxRetryBase   time.Duration `env:"OUTBOX_RETRY_BASE" default:"1s" min:"1ms" help:"first backoff between attempts, doubling"`
	OutboxRetryMax    time.Duration `env:"OUTBOX_RETRY_MAX" default:"10m" min:"1ms" help:"longest backoff between attempts"`
	// ProcessorKeyWindow is how long the processor remembers an idempotency
	// key (PROCESSOR_KEY_WINDOW; Stripe: 24 h). A retry after it could charge
	// a second time, so the outbox's whole retry schedule must end inside it.
	ProcessorKeyWindow time.Duration `env:"PROCESSOR_KEY_WINDOW" default:"24h" min:"1m" help:"how long the processor remembers a key; the retry schedule must fit"`
	// ReconcileInterval is how often the reconciler settles payments and
	// refunds left undecided (RECONCILE_INTERVAL); ReconcileGrace is how long
	// a row's job must have ended before it is looked up at the processor
	// (RECONCILE_GRACE), longer than PROCESSOR_TIMEOUT so that no call of
	// the job can still arrive.
	ReconcileInterval time.Duration `env:"RECONCILE_INTERVAL" default:"1m" min:"1s" help:"how often undecided payments and refunds are reconciled"`
	ReconcileGrace    time.Duration `env:"RECONCILE_GRACE" default:"2m" min:"1s" help:"a row is looked up this long after its job ended"`
	// IdempotencyWindow is the published retry window (IDEMPOTENCY_WINDOW).
	IdempotencyWindow time.Duration `env:"IDEMPOTENCY_WINDOW" default:"24h" min:"1m" help:"the retry window; never shorter than openapi.yaml's"`
	// IdempotencyMargin is kept beyond the window before a key may be
	// deleted, so clocks and slow retries never cut the promise short
	// (IDEMPOTENCY_MARGIN).
	IdempotencyMargin time.Duration `env:"IDEMPOTENCY_MARGIN" default:"1h" min:"0s" help:"kept beyond the window before a key may be deleted"`
	// MaxBodyBytes bounds request bodies; larger ones get 413 (MAX_BODY_BYTES).
	MaxBodyBytes int64 `env:"MAX_BODY_BYTES" default:"1048576" min:"1024" max:"67108864" help:"larger request bodies get 413"`
	// MaxStoredResponseBytes caps a stored response body; a larger one is
	// stored as a reference and re-derived on replay
	// (MAX_STORED_RESPONSE_BYTES).
	MaxStoredResponseBytes int `env:"MAX_STORED_RESPONSE_BYTES" default:"65536" min:"1" max:"16777216" help:"larger responses are stored as a reference"`
	// KeyQuota is the most live idempotency keys per principal; 0 turns
	// the quota off (IDEMPOTENCY_KEY_QUOTA).
	KeyQuota int64 `env:"IDEMPOTENCY_KEY_QUOTA" default:"1000000" min:"0" max:"1125899906842624" help:"live keys per principal, then 429 (0: no quota)"`
	// RateLimit is the most requests a second of one principal, in this
	// process (RATE_LIMIT); RateLimitUnauthenticated the most of one client
	// address before its key is known here (RATE_LIMIT_UNAUTHENTICATED).
	// 0 turns either off.
	RateLimit                int `env:"RATE_LIMIT" default:"100" min:"0" max:"1000000" help:"requests a second of one principal, per process; past it 429 with Retry-After (0: off)"`
	RateLimitUnauthenticated int `env:"RATE_LIMIT_UNAUTHENTICATED" default:"20" min:"0" max:"1000000" help:"requests a second of one client address whose key is not known yet (no key, a bad one, a new one), per process (0: off)"`
	// QuotaRefresh is how long a principal's key count is cached and how
	// often claim counts are flushed (IDEMPOTENCY_QUOTA_REFRESH).
	QuotaRefresh time.Duration `env:"IDEMPOTENCY_QUOTA_REFRESH" default:"5s" min:"100ms" help:"how long key counts are cached and claims buffered"`
	// SweepInterval is how often the in-service sweeper runs; 0 turns it
	// off, for deployments that run `api sweep` from cron (SWEEP_INTERVAL).
	SweepInterval time.Duration `env:"SWEEP_INTERVAL" default:"1m" min:"0s" help:"how often expired keys are swept (0: never, use api sweep)"`
	// SweepChunk is the most rows one sweep DELETE removes (SWEEP_CHUNK).
	SweepChunk int `env:"SWEEP_CHUNK" default:"1000" min:"1" max:"100000" help:"most rows one sweep statement deletes"`
	// SweepPause is the wait between chunks (SWEEP_PAUSE).
	SweepPause time.Duration `env:"SWEEP_PAUSE" default:"50ms" min:"0s" help:"pause between sweep chunks"`
	// RequestTimeout bounds a whole request, database work included
	// (REQUEST_TIMEOUT).
	RequestTimeout time.Duration `env:"REQUEST_TIMEOUT" default:"15s" min:"1s" help:"bound on one request's work"`
	// BodyTimeout bounds reading a request, headers and body, from its first
	// byte (BODY_TIMEOUT; the server's ReadTimeout). It is shorter than
	// RequestTimeout, and the write deadline is RequestTimeout + 5 s, so a
	// body that arrives too slowly gets its 408 on the wire while the request
	// still has time left to answer.
	BodyTimeout time.Duration `env:"BODY_TIMEOUT" default:"10s" min:"100ms" help:"a request must arrive within this, else 408 (2/3 of a shorter REQUEST_TIMEOUT)"`
	// WebhookSigningKey derives every webhook endpoint's signing secret
	// (WEBHOOK_SIGNING_KEY, base64, at least 32 bytes). Required in
	// production; development uses DevelopmentWebhookKey. Changing it
	// changes every endpoint's secret: rotate each endpoint's instead.
	WebhookSigningKey []byte `env:"WEBHOOK_SIGNING_KEY" default:"ZGV2ZWxvcG1lbnQgd2ViaG9vayBrZXk6IHNldCBXRUJIT09LX1NJR05JTkdfS0VZIQ==" min:"32" secret:"true" help:"base64 of at least 32 random bytes; derives every webhook secret; unset: a published development key (production refuses)"`
	// WebhookAllowPrivateURLs lets webhook endpoints use http and loopback,
	// private or link-local addresses (WEBHOOK_ALLOW_PRIVATE_URLS): a
	// receiver on a developer's machine. On by default in development;
	// production refuses it (server-side request forgery).
	WebhookAllowPrivateURLs bool `env:"WEBHOOK_ALLOW_PRIVATE_URLS" default:"true" help:"webhook URLs may be http and loopback or private addresses (false with APP_ENV=production, which refuses true)"`
	// WebhookTimeout bounds one delivery attempt (WEBHOOK_TIMEOUT).
	WebhookTimeout time.Duration `env:"WEBHOOK_TIMEOUT" default:"10s" min:"100ms" help:"bound on one webhook delivery attempt"`
	// WebhookEndpointConcurrency is the most delivery attempts to one
	// endpoint that run at once, across every instance
	// (WEBHOOK_ENDPOINT_CONCURRENCY; 0: no bound): one tenant's slow
	// receiver holds that many of the webhook workers, not all of them.
	WebhookEndpointConcurrency int `env:"WEBHOOK_ENDPOINT_CONCURRENCY" default:"8" min:"0" max:"10000" help:"most delivery attempts to one endpoint at once, across instances (0: no bound)"`
	// WebhookDisableAfter disables an endpoint whose every attempt has
	// failed for this long, and tells its owner with a
	// webhook_endpoint.disabled event (WEBHOOK_DISABLE_AFTER; 0: never).
	WebhookDisableAfter time.Duration `env:"WEBHOOK_DISABLE_AFTER" default:"120h" min:"0s" help:"an endpoint whose every attempt failed this long is disabled, with a webhook_endpoint.disabled event (0: never)"`
	// WebhookSchedule is when each delivery attempt is made after the
	// previous failed; its length is the attempts (WEBHOOK_RETRY_SCHEDULE).
	// The default is the Standard Webhooks specification's example: eight
	// attempts over about 28 hours; a receiver down for longer misses the
	// event (it stays listable in GET /v1/events for 30 days).
	WebhookSchedule []time.Duration `env:"WEBHOOK_RETRY_SCHEDULE" default:"0s,5s,5m,30m,2h,5h,10h,10h" min:"1" max:"20" help:"delay before each delivery attempt; its length is the attempts"`
	// ShutdownTimeout bounds graceful shutdown after SIGTERM (SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" default:"20s" min:"1s" help:"bound on graceful shutdown"`
	// LogLevel is debug, info, warn or error (LOG_LEVEL).
	LogLevel slog.Level `env:"LOG_LEVEL" default:"info" help:"debug, info, warn or error"`
}

// DevelopmentWebhookKey is the webhook signing key of development, when
// WEBHOOK_SIGNING_KEY is unset (its default tag, in base64): published
// here, so anyone can derive its secrets. Production refuses to run
// without a key of its own.
var DevelopmentWebhookKey = Defaults().WebhookSigningKey

// Load reads the environment through getenv (os.Getenv in production) on top
// of Defaults and validates the result. The error names every bad variable.
func Load(getenv func(string) string) (Config, error) {
	c := Defaults()
	var errs []error
	for _, f := range fields(&c) {
		if v := getenv(f.name); v != "" {
			if err := f.set(v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	switch c.Env {
	case EnvDevelopment:
	case EnvProduction:
		// Defaults of a developer's machine that production does not take
		// unless told to (and then refuses, below).
		if getenv("MIGRATE_ON_START") == "" {
			c.MigrateOnStart = false // migrations are their own step: `api migrate up`
		}
		if getenv("WEBHOOK_ALLOW_PRIVATE_URLS") == "" {
			c.WebhookAllowPrivateURLs = false
		}
	default:
		errs = append(errs, fmt.Errorf("APP_ENV=%q: want development or production", c.Env))
	}
	// One setting names the database: unset, the owner's and the
	// maintenance role's URLs are DATABASE_URL with their own user, so
	// pointing DATABASE_URL elsewhere moves all three together.
	if getenv("DATABASE_URL") != "" {
		if getenv("MIGRATE_DATABASE_URL") == "" {
			c.MigrateDatabaseURL = database.WithUser(c.DatabaseURL, "postgres")
		}
		if getenv("MAINTENANCE_DATABASE_URL") == "" {
			c.MaintenanceDatabaseURL = database.WithUser(c.DatabaseURL, "payments_maintenance")
		}
	}
	if c.DBCommitTimeout >= 5*time.Second {
		errs = append(errs, errors.New("DB_COMMIT_TIMEOUT must be under 5s: the response must still be written after it (REQUEST_TIMEOUT + 5s)"))
	}
	if getenv("BODY_TIMEOUT") == "" && c.BodyTimeout >= c.RequestTimeout {
		// A short REQUEST_TIMEOUT alone (the fault suite's 1 s) keeps the
		// order read < request: the body gets two thirds of it.
		c.BodyTimeout = c.RequestTimeout * 2 / 3
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
	SecretKey string `env:"STRIPE_SECRET_KEY" default:"" secret:"true" help:"PROCESSOR=stripe: the API key; sk_live_ or rk_live_ moves money, sk_test_ is test mode"`
	// URL is Stripe's API (STRIPE_API_URL); empty is Stripe's own, and
	// stripe-mock is another.
	URL string `env:"STRIPE_API_URL" default:"" help:"PROCESSOR=stripe: the API's address; empty: Stripe's own (stripe-mock for tests)"`
	// PaymentMethod is charged for every payment (STRIPE_PAYMENT_METHOD):
	// this API takes no card (docs/external-effects.md, "Stripe").
	PaymentMethod string `env:"STRIPE_PAYMENT_METHOD" default:"pm_card_visa" help:"PROCESSOR=stripe: the payment method charged (the API takes no card); the default is Stripe's test Visa"`
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
	Latency     time.Duration `env:"PROCESSOR_SIM_LATENCY" default:"0s" min:"0s" help:"api processor-sim: delay before each call is processed"`
	CommitDelay time.Duration `env:"PROCESSOR_SIM_COMMIT_DELAY" default:"0s" min:"0s" help:"api processor-sim: a call is processed this long after it arrived, even if its caller gave up (a late charge)"`
	ErrorRate   float64       `env:"PROCESSOR_SIM_ERROR_RATE" default:"0" min:"0" max:"1" help:"api processor-sim: share of calls answered 503, nothing done"`
	DropRate    float64       `env:"PROCESSOR_SIM_DROP_RATE" default:"0" min:"0" max:"1" help:"api processor-sim: share of charges made whose reply is dropped"`
	TimeoutRate float64       `env:"PROCESSOR_SIM_TIMEOUT_RATE" default:"0" min:"0" max:"1" help:"api processor-sim: share of replies held for PROCESSOR_SIM_HOLD"`
	Hold        time.Duration `env:"PROCESSOR_SIM_HOLD" default:"0s" min:"0s" help:"api processor-sim: how long a held reply waits"`
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
