package database_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// A transaction left open in this database holds the lists' horizon; once
// a newer one commits (a row the lists now hold out), the gauge's lag grows
// while the old one stays open; once it ends, the lag is 0.
func TestListLagOfAnOpenTransaction(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 5)
	ctx := context.Background()
	pool, err := database.Open(ctx, db.MaintenanceURL, database.PoolConfig{MaxConns: 1, AcquireTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	h := database.NewListLag(pool)
	t0 := time.Now()
	lag, err := h.Collect(ctx, t0)
	require.NoError(t, err)
	require.Zero(t, lag)

	stray, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = stray.Close(context.Background()) })
	tx, err := stray.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	// Other databases' transactions on a shared server move xmax too, so
	// this sample may already count: the bounds below allow for it.
	_, err = h.Collect(ctx, t0.Add(5*time.Second))
	require.NoError(t, err)
	newer, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = newer.Close(context.Background()) })
	_, err = newer.Exec(ctx, `SELECT pg_current_xact_id()`) // commits a newer transaction
	require.NoError(t, err)

	_, err = h.Collect(ctx, t0.Add(10*time.Second))
	require.NoError(t, err)
	lag, err = h.Collect(ctx, t0.Add(25*time.Second))
	require.NoError(t, err)
	require.GreaterOrEqual(t, lag, 15*time.Second, "held out since the newer one committed, by the sample at 10 s")
	require.LessOrEqual(t, lag, 20*time.Second, "and not before the transaction began, after the sample at 0 s")

	require.NoError(t, tx.Rollback(ctx))
	// A transaction of another database that ended just as a sample looked
	// may hold one sample's horizon: the lag is 0 once nothing holds it.
	at := t0.Add(30 * time.Second)
	require.Eventually(t, func() bool {
		at = at.Add(time.Second)
		lag, err := h.Collect(ctx, at)
		return err == nil && lag == 0
	}, 10*time.Second, 10*time.Millisecond)
}
