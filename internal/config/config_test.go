package config_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/config"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(nil))
	require.NoError(t, err)
	require.Equal(t, config.Defaults(), c)
	// The documented defaults (README, Configuration).
	require.Equal(t, ":8080", c.Addr)
	require.Equal(t, ":9090", c.MetricsAddr)
	require.Equal(t, 24*time.Hour, c.IdempotencyWindow)
	require.Equal(t, 25*time.Hour, c.Retention())
	require.Equal(t, 5*time.Second, c.LockTimeout)
	require.EqualValues(t, 1<<20, c.MaxBodyBytes)
	require.Equal(t, 64<<10, c.MaxStoredResponseBytes)
	require.EqualValues(t, 1_000_000, c.KeyQuota)
	require.Equal(t, time.Minute, c.SweepInterval)
	require.False(t, c.Pprof)
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{
		"IDEMPOTENCY_WINDOW": "48h", "IDEMPOTENCY_MARGIN": "30m", "DB_MAX_CONNS": "8", "MIGRATE_ON_START": "false",
	}))
	require.NoError(t, err)
	require.Equal(t, 48*time.Hour+30*time.Minute, c.Retention())
	require.EqualValues(t, 8, c.DBMaxConns)
	require.False(t, c.MigrateOnStart)
}

func TestInvalidValuesAreNamed(t *testing.T) {
	t.Parallel()
	_, err := config.Load(env(map[string]string{
		"IDEMPOTENCY_WINDOW": "a day",
		"MAX_BODY_BYTES":     "-1",
		"MIGRATE_ON_START":   "perhaps",
		"DATABASE_URL":       "mysql://x",
		"LOG_LEVEL":          "loud",
	}))
	for _, name := range []string{"IDEMPOTENCY_WINDOW", "MAX_BODY_BYTES", "MIGRATE_ON_START", "DATABASE_URL", "LOG_LEVEL"} {
		require.ErrorContains(t, err, name)
	}
}

// Production turns off what only suits a developer's machine; a schedule
// is read as written.
func TestWebhookSettings(t *testing.T) {
	t.Parallel()
	key := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // 32 bytes
	c, err := config.Load(env(map[string]string{"APP_ENV": "production", "PROCESSOR_URL": "https://processor", "WEBHOOK_SIGNING_KEY": key}))
	require.NoError(t, err)
	require.False(t, c.WebhookAllowPrivateURLs)
	require.Equal(t, "0123456789abcdef0123456789abcdef", string(c.WebhookSigningKey))
	c, err = config.Load(env(map[string]string{"WEBHOOK_RETRY_SCHEDULE": "0s, 1s,2m"}))
	require.NoError(t, err)
	require.True(t, c.WebhookAllowPrivateURLs, "development allows a receiver on this machine")
	require.Equal(t, []time.Duration{0, time.Second, 2 * time.Minute}, c.WebhookSchedule)
}

func TestLogAttrsMaskPasswords(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DATABASE_URL": "postgres://app:hunter2@db/payments"}))
	require.NoError(t, err)
	require.NotContains(t, fmtAttrs(c.LogAttrs()), "hunter2")
}

func fmtAttrs(attrs []any) string {
	s := ""
	for _, a := range attrs {
		s += fmt.Sprint(a) + " "
	}
	return s
}

// The running window can never be shorter than the one openapi.yaml
// publishes: clients retry on the published promise.
func TestWindowShorterThanPublishedIsRefused(t *testing.T) {
	t.Parallel()
	_, err := config.Load(func(k string) string { return map[string]string{"IDEMPOTENCY_WINDOW": "1h"}[k] })
	require.ErrorContains(t, err, "IDEMPOTENCY_WINDOW=1h0m0s is shorter than the 24h0m0s that openapi.yaml promises")
	_, err = config.Load(func(k string) string { return map[string]string{"IDEMPOTENCY_WINDOW": "24h"}[k] })
	require.NoError(t, err)
}

// The outbox's retry schedule must end inside the processor's key window: a
// retry after the processor forgot the key would be a second charge.
func TestRetryScheduleMustFitTheProcessorKeyWindow(t *testing.T) {
	t.Parallel()
	c := config.Defaults()
	// 15 attempts of at most OUTBOX_RESCUE_AFTER (2 min) each, and 14
	// backoffs: 1+2+...+512 s, then 4 at the 10 min ceiling.
	require.Equal(t, 30*time.Minute+1023*time.Second+4*10*time.Minute, c.RetrySchedule())

	_, err := config.Load(env(map[string]string{"OUTBOX_MAX_ATTEMPTS": "100", "OUTBOX_RETRY_MAX": "1h"}))
	require.ErrorContains(t, err, "not inside PROCESSOR_KEY_WINDOW=24h0m0s")
	_, err = config.Load(env(map[string]string{"OUTBOX_MAX_ATTEMPTS": "100", "OUTBOX_RETRY_MAX": "1h", "PROCESSOR_KEY_WINDOW": "168h"}))
	require.NoError(t, err)
	_, err = config.Load(env(map[string]string{"PROCESSOR_KEY_WINDOW": "1h"}))
	require.ErrorContains(t, err, "PROCESSOR_KEY_WINDOW=1h0m0s")
}

// The reconciler must not take "no record" for an answer while a call with
// the key can still reach the processor.
func TestReconcileGraceOutlastsAProcessorCall(t *testing.T) {
	t.Parallel()
	_, err := config.Load(env(map[string]string{"RECONCILE_GRACE": "5s"}))
	require.ErrorContains(t, err, "RECONCILE_GRACE (5s) must be longer than PROCESSOR_TIMEOUT (10s)")
}

// One setting names the database: the owner's and the maintenance role's URLs
// follow DATABASE_URL unless set, and none may name another database (keys
// created there would be invisible to the service: every request a 401).
func TestDatabaseURLNamesTheDatabaseForEveryRole(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DATABASE_URL": "postgres://payments_app:pw@db.internal:6432/shop?sslmode=require"}))
	require.NoError(t, err)
	require.Equal(t, "postgres://postgres@db.internal:6432/shop?sslmode=require", c.MigrateDatabaseURL)
	require.Equal(t, "postgres://payments_maintenance@db.internal:6432/shop?sslmode=require", c.MaintenanceDatabaseURL)

	c, err = config.Load(env(map[string]string{
		"DATABASE_URL":         "postgres://payments_app@pooler:6432/shop",
		"MIGRATE_DATABASE_URL": "postgres://owner:secret@primary:5432/shop",
	}))
	require.NoError(t, err, "another host for the owner is fine: same database")
	require.Equal(t, "postgres://owner:secret@primary:5432/shop", c.MigrateDatabaseURL)

	_, err = config.Load(env(map[string]string{"DATABASE_URL": "postgres://payments_app@127.0.0.1:5432/shop", "MIGRATE_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/payments"}))
	require.ErrorContains(t, err, `MIGRATE_DATABASE_URL names the database "payments", DATABASE_URL "shop"`)
}

// The deadlines stay ordered read < request: BODY_TIMEOUT follows a short
// REQUEST_TIMEOUT when it is not set, and is refused when set out of order.
func TestBodyTimeoutStaysShorterThanTheRequest(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"REQUEST_TIMEOUT": "1s", "LOCK_TIMEOUT": "300ms"}))
	require.NoError(t, err)
	require.Less(t, c.BodyTimeout, c.RequestTimeout)
	_, err = config.Load(env(map[string]string{"REQUEST_TIMEOUT": "1s", "LOCK_TIMEOUT": "300ms", "BODY_TIMEOUT": "2s"}))
	require.ErrorContains(t, err, "BODY_TIMEOUT (2s) must be shorter than REQUEST_TIMEOUT (1s)")
}

// PROCESSOR=stripe: production accepts it, livemode follows the key, and
// what would charge wrongly or read a charge as missing is refused.
func TestStripeSettings(t *testing.T) {
	t.Parallel()
	key := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	stripe := func(extra map[string]string) map[string]string {
		vars := map[string]string{"APP_ENV": "production", "WEBHOOK_SIGNING_KEY": key, "PROCESSOR": "stripe", "STRIPE_SECRET_KEY": "sk_test_abc", "RECONCILE_GRACE": "10m"}
		for k, v := range extra {
			vars[k] = v
		}
		return vars
	}
	c, err := config.Load(env(stripe(nil)))
	require.NoError(t, err)
	require.False(t, c.Livemode(), "a test key moves no money")
	require.False(t, c.Simulated())
	require.NotContains(t, fmtAttrs(c.LogAttrs()), "sk_test_abc", "the key is never logged")

	c, err = config.Load(env(stripe(map[string]string{"STRIPE_SECRET_KEY": "rk_live_abc", "STRIPE_PAYMENT_METHOD": "pm_from_the_account"})))
	require.NoError(t, err)
	require.True(t, c.Livemode())

	for name, c := range map[string]struct {
		vars map[string]string
		want string
	}{
		"no key":                                {map[string]string{"STRIPE_SECRET_KEY": ""}, "needs STRIPE_SECRET_KEY"},
		"two processors":                        {map[string]string{"PROCESSOR_URL": "https://processor"}, "both set"},
		"a live key and the test card":          {map[string]string{"STRIPE_SECRET_KEY": "sk_live_abc"}, "Stripe's test card"},
		"a grace shorter than the search's lag": {map[string]string{"RECONCILE_GRACE": "2m"}, "RECONCILE_GRACE of at least 5m0s"},
		"an unknown processor":                  {map[string]string{"PROCESSOR": "adyen"}, `PROCESSOR="adyen"`},
	} {
		_, err := config.Load(env(stripe(c.vars)))
		require.ErrorContains(t, err, c.want, name)
	}
	_, err = config.Load(env(map[string]string{"STRIPE_SECRET_KEY": "sk_test_abc"}))
	require.ErrorContains(t, err, "PROCESSOR is not stripe", "a key without PROCESSOR=stripe would be ignored")
	_, err = config.Load(env(map[string]string{"APP_ENV": "production", "WEBHOOK_SIGNING_KEY": key}))
	require.ErrorContains(t, err, "needs PROCESSOR_URL or PROCESSOR=stripe")
}
