package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// Two instances share one quota through the usage table: what one flushes,
// the other counts at its next refresh.
func TestQuotaIsSharedAcrossInstances(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 4)
	ctx := context.Background()
	pool, err := database.Open(ctx, db.AppURL, database.PoolConfig{MaxConns: 4, AcquireTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := idempotency.QuotaConfig{Limit: 5, Retention: 25 * time.Hour, Refresh: 50 * time.Millisecond}
	one, two := idempotency.NewQuota(pool, cfg), idempotency.NewQuota(pool, cfg)
	p := uuid.New()

	for range 5 {
		ok, err := one.Allow(ctx, pool.Pgx(), p)
		require.NoError(t, err)
		require.True(t, ok)
		one.Record(p)
	}
	ok, err := one.Allow(ctx, pool.Pgx(), p)
	require.NoError(t, err)
	require.False(t, ok, "the instance that counted knows at once")

	ok, err = two.Allow(ctx, pool.Pgx(), p)
	require.NoError(t, err)
	require.True(t, ok, "nothing flushed yet")
	require.NoError(t, one.Flush(ctx))
	require.Eventually(t, func() bool {
		ok, err := two.Allow(ctx, pool.Pgx(), p)
		return err == nil && !ok
	}, 5*time.Second, 20*time.Millisecond, "the other instance sees the flushed counts after its refresh")

	ok, err = two.Allow(ctx, pool.Pgx(), uuid.New())
	require.NoError(t, err)
	require.True(t, ok, "other principals are unaffected")
}
