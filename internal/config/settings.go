package config

import (
	"fmt"
	"strings"
	"time"
)

// Setting is one environment variable: its name, its default as text, and a
// line of help. Settings is the one table `api --help` prints and README.md's
// configuration table is checked against (TestREADMEListsEverySetting), and
// every variable Load reads is in it (TestSettingsCoverEverythingLoadReads).
type Setting struct {
	Name, Default, Help string
}

// Settings lists every variable Load reads, with Defaults' values.
func Settings() []Setting {
	d := Defaults()
	return []Setting{
		{"APP_ENV", d.Env, "development or production (refuses the simulator and migrating on start)"},
		{"ADDR", d.Addr, "the API's listen address"},
		{"METRICS_ADDR", d.MetricsAddr, "the /metrics listener, apart from the API (off disables it)"},
		{"PPROF", fmt.Sprint(d.Pprof), "serve /debug/pprof/ on the metrics listener"},
		{"ADMIN_PASSWORD", "", "serve River UI at /riverui/ on the metrics listener, behind basic auth (user admin); at least 16 characters; unset: not served"},
		{"DATABASE_URL", d.DatabaseURL, "the service role's database; names the database for every role"},
		{"MIGRATE_DATABASE_URL", d.MigrateDatabaseURL, "the owner role (migrations, keys); default: DATABASE_URL as postgres"},
		{"MAINTENANCE_DATABASE_URL", d.MaintenanceDatabaseURL, "the sweeper's role; default: DATABASE_URL as payments_maintenance"},
		{"MIGRATE_ON_START", fmt.Sprint(d.MigrateOnStart), "serve creates the database and migrates (false with APP_ENV=production)"},
		{"DB_MAX_CONNS", fmt.Sprint(d.DBMaxConns), "the service pool's size"},
		{"DB_ACQUIRE_TIMEOUT", duration(d.DBAcquireTimeout), "longest wait for a pooled connection, then 503"},
		{"LOCK_TIMEOUT", duration(d.LockTimeout), "longest wait for a concurrent request with the same key, then 409"},
		{"DB_IDLE_IN_TX_TIMEOUT", duration(d.DBIdleInTxTimeout), "the server ends a session idle in a transaction this long"},
		{"IDEMPOTENCY_WINDOW", duration(d.IdempotencyWindow), "the retry window; never shorter than openapi.yaml's"},
		{"IDEMPOTENCY_MARGIN", duration(d.IdempotencyMargin), "kept beyond the window before a key may be deleted"},
		{"MAX_BODY_BYTES", fmt.Sprint(d.MaxBodyBytes), "larger request bodies get 413"},
		{"MAX_STORED_RESPONSE_BYTES", fmt.Sprint(d.MaxStoredResponseBytes), "larger responses are stored as a reference"},
		{"IDEMPOTENCY_KEY_QUOTA", fmt.Sprint(d.KeyQuota), "live keys per principal, then 429 (0: no quota)"},
		{"IDEMPOTENCY_QUOTA_REFRESH", duration(d.QuotaRefresh), "how long key counts are cached and claims buffered"},
		{"SWEEP_INTERVAL", duration(d.SweepInterval), "how often expired keys are swept (0: never, use api sweep)"},
		{"SWEEP_CHUNK", fmt.Sprint(d.SweepChunk), "most rows one sweep statement deletes"},
		{"SWEEP_PAUSE", duration(d.SweepPause), "pause between sweep chunks"},
		{"REQUEST_TIMEOUT", duration(d.RequestTimeout), "bound on one request's work"},
		{"BODY_TIMEOUT", duration(d.BodyTimeout), "a request must arrive within this, else 408 (2/3 of a shorter REQUEST_TIMEOUT)"},
		{"PROCESSOR", d.Processor, "the processor's adapter: http (PROCESSOR_URL) or stripe (STRIPE_*)"},
		{"PROCESSOR_URL", d.ProcessorURL, "PROCESSOR=http: the payment processor; empty: the in-process simulator (test mode)"},
		{"STRIPE_SECRET_KEY", "", "PROCESSOR=stripe: the API key; sk_live_ or rk_live_ moves money, sk_test_ is test mode"},
		{"STRIPE_API_URL", d.Stripe.URL, "PROCESSOR=stripe: the API's address; empty: Stripe's own (stripe-mock for tests)"},
		{"STRIPE_PAYMENT_METHOD", d.Stripe.PaymentMethod, "PROCESSOR=stripe: the payment method charged (the API takes no card); the default is Stripe's test Visa"},
		{"PROCESSOR_TIMEOUT", duration(d.ProcessorTimeout), "bound on one processor call"},
		{"PROCESSOR_KEY_WINDOW", duration(d.ProcessorKeyWindow), "how long the processor remembers a key; the retry schedule must fit"},
		{"PROCESSOR_SIM_LATENCY", duration(d.Sim.Latency), "api processor-sim: delay before each call is processed"},
		{"PROCESSOR_SIM_ERROR_RATE", fmt.Sprint(d.Sim.ErrorRate), "api processor-sim: share of calls answered 503, nothing done"},
		{"PROCESSOR_SIM_DROP_RATE", fmt.Sprint(d.Sim.DropRate), "api processor-sim: share of charges made whose reply is dropped"},
		{"PROCESSOR_SIM_TIMEOUT_RATE", fmt.Sprint(d.Sim.TimeoutRate), "api processor-sim: share of replies held for PROCESSOR_SIM_HOLD"},
		{"PROCESSOR_SIM_HOLD", duration(d.Sim.Hold), "api processor-sim: how long a held reply waits"},
		{"PROCESSOR_SIM_COMMIT_DELAY", duration(d.Sim.CommitDelay), "api processor-sim: a call is processed this long after it arrived, even if its caller gave up (a late charge)"},
		{"RATE_LIMIT", fmt.Sprint(d.RateLimit), "requests a second of one principal, per process; past it 429 with Retry-After (0: off)"},
		{"RATE_LIMIT_UNAUTHENTICATED", fmt.Sprint(d.RateLimitUnauthenticated), "requests a second of one client address whose key is not known yet (no key, a bad one, a new one), per process (0: off)"},
		{"DB_COMMIT_TIMEOUT", duration(d.DBCommitTimeout), "bound on a request's COMMIT, which neither the client nor REQUEST_TIMEOUT cancels (under 5s)"},
		{"OUTBOX_WORKERS", fmt.Sprint(d.OutboxWorkers), "processor jobs worked at once (0: leave them to others); at least payments/s x one charge's p99 time (the processor's latency plus the job's own work)"},
		{"WEBHOOK_WORKERS", fmt.Sprint(d.WebhookWorkers), "webhook deliveries worked at once, in a queue apart from the processor jobs (0: leave them to others); at least deliveries/s x a receiver's p99 time"},
		{"OUTBOX_DB_MAX_CONNS", fmt.Sprint(d.OutboxDBMaxConns), "the outbox's own pool; workers hold a connection only for their short transactions"},
		{"WEBHOOK_DB_MAX_CONNS", fmt.Sprint(d.WebhookDBMaxConns), "the webhook deliveries' own pool, apart from the charges': deliveries never take a charge's connection"},
		{"OUTBOX_JOB_TIMEOUT", duration(d.OutboxJobTimeout), "bound on one attempt of a job"},
		{"OUTBOX_RESCUE_AFTER", duration(d.OutboxRescueAfter), "a dead worker's job runs again after this"},
		{"OUTBOX_MAX_ATTEMPTS", fmt.Sprint(d.OutboxMaxAttempts), "a job's retry budget; then requires_reconciliation"},
		{"OUTBOX_RETRY_BASE", duration(d.OutboxRetryBase), "first backoff between attempts, doubling"},
		{"OUTBOX_RETRY_MAX", duration(d.OutboxRetryMax), "longest backoff between attempts"},
		{"RECONCILE_INTERVAL", duration(d.ReconcileInterval), "how often undecided payments and refunds are reconciled"},
		{"RECONCILE_GRACE", duration(d.ReconcileGrace), "a row is looked up this long after its job ended"},
		{"WEBHOOK_SIGNING_KEY", "", "base64 of at least 32 random bytes; derives every webhook secret; unset: a published development key (production refuses)"},
		{"WEBHOOK_ALLOW_PRIVATE_URLS", fmt.Sprint(d.WebhookAllowPrivateURLs), "webhook URLs may be http and loopback or private addresses (false with APP_ENV=production, which refuses true)"},
		{"WEBHOOK_TIMEOUT", duration(d.WebhookTimeout), "bound on one webhook delivery attempt"},
		{"WEBHOOK_ENDPOINT_CONCURRENCY", fmt.Sprint(d.WebhookEndpointConcurrency), "most delivery attempts to one endpoint at once, across instances (0: no bound)"},
		{"WEBHOOK_DISABLE_AFTER", duration(d.WebhookDisableAfter), "an endpoint whose every attempt failed this long is disabled, with a webhook_endpoint.disabled event (0: never)"},
		{"WEBHOOK_RETRY_SCHEDULE", formatSchedule(d.WebhookSchedule), "delay before each delivery attempt; its length is the attempts"},
		{"SHUTDOWN_TIMEOUT", duration(d.ShutdownTimeout), "bound on graceful shutdown"},
		{"LOG_LEVEL", strings.ToLower(d.LogLevel.String()), "debug, info, warn or error"},
	}
}

// duration writes d as README does: 2m rather than 2m0s.
func duration(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if strings.HasSuffix(s, zero) && len(s) > len(zero) && strings.ContainsAny(s[:len(s)-len(zero)], "hm") {
			s = strings.TrimSuffix(s, zero)
		}
	}
	return s
}
