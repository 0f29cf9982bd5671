package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type sweepBundle struct {
	admin   *pgxpool.Pool
	maint   *database.Pool
	sweeper *idempotency.Sweeper
}

func setupSweep(t *testing.T, chunk int) *sweepBundle {
	t.Helper()
	// admin: 2, maintenance: 4 (two sweepers racing, each with a lock
	// holder, and a test's own holder).
	db := testdb.New(t, 6)
	ctx := context.Background()
	adminCfg, err := pgxpool.ParseConfig(db.AdminURL)
	require.NoError(t, err)
	adminCfg.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	maint, err := database.Open(ctx, db.MaintenanceURL, database.PoolConfig{MaxConns: 4, AcquireTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(maint.Close)
	sweeper, err := idempotency.NewSweeper(maint, idempotency.SweeperConfig{Chunk: chunk, Pause: time.Millisecond, Retention: 25 * time.Hour})
	require.NoError(t, err)
	return &sweepBundle{admin: admin, maint: maint, sweeper: sweeper}
}

// sweepPrincipals is how many principals insertKeys spreads keys over: the
// sweeper works one principal at a time.
const sweepPrincipals = 50

// insertKeys adds n completed keys whose expires_at is offset from now,
// spread over sweepPrincipals principals (created on first use).
func (b *sweepBundle) insertKeys(t *testing.T, prefix string, n int, offset time.Duration) {
	t.Helper()
	ctx := context.Background()
	_, err := b.admin.Exec(ctx, `
		INSERT INTO principals (id, name) SELECT gen_random_uuid(), 'sweep-' || i FROM generate_series(1, $1) i
		ON CONFLICT (name) DO NOTHING`, sweepPrincipals)
	require.NoError(t, err)
	_, err = b.admin.Exec(ctx, `
		INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, response_status, response_content_type, response_body, correlation_id, created_at, expires_at)
		SELECT p.id, 'POST /v1/payments', $1 || i, 'completed', sha256(''), 201, 'application/json', '{}', 'req',
		       now() + $3 * interval '1 millisecond' - interval '25 hours', now() + $3 * interval '1 millisecond' - (i % 100) * interval '1 second'
		FROM generate_series(1, $2) i
		JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM principals WHERE name LIKE 'sweep-%') p ON p.n = i % $4`,
		prefix, n, offset.Milliseconds(), sweepPrincipals)
	require.NoError(t, err)
}

func (b *sweepBundle) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE `+where).Scan(&n))
	return n
}

func TestSweepDeletesExactlyTheExpiredRows(t *testing.T) {
	t.Parallel()
	b := setupSweep(t, 1000)
	b.insertKeys(t, "expired-", 20_000, -time.Minute)
	b.insertKeys(t, "live-", 1_000, time.Hour)

	deleted, err := b.sweeper.Sweep(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 20_000, deleted)
	require.Equal(t, 1_000, b.count(t, "true"))
	require.Equal(t, 1_000, b.count(t, "key LIKE 'live-%' AND expires_at > now()"))
}

func TestOnlyOneSweeperRunsAtATime(t *testing.T) {
	t.Parallel()
	b := setupSweep(t, 500)
	b.insertKeys(t, "expired-", 5_000, -time.Minute)
	ctx := context.Background()

	// Another instance holds the sweeper lock: this one does nothing.
	holder, err := b.maint.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, idempotency.SweeperLockID)
	require.NoError(t, err)
	_, err = b.sweeper.Sweep(ctx)
	require.ErrorIs(t, err, idempotency.ErrSweepBusy)
	require.Equal(t, 5_000, b.count(t, "true"))
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, idempotency.SweeperLockID)
	require.NoError(t, err)

	// Two sweepers started together: between them every expired row is
	// deleted once, and whichever lost the lock reports that it was busy.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	for range 2 {
		wg.Go(func() {
			n, err := b.sweeper.Sweep(ctx)
			if err != nil && !errors.Is(err, idempotency.ErrSweepBusy) {
				t.Errorf("sweep: %v", err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	require.EqualValues(t, 5_000, total)
	require.Equal(t, 0, b.count(t, "true"))
}

// The sweeper can never delete a live row: even a hand-written DELETE as the
// maintenance role is limited to expired rows by row-level security.
func TestSweeperRoleCannotDeleteLiveRows(t *testing.T) {
	t.Parallel()
	b := setupSweep(t, 1000)
	b.insertKeys(t, "live-", 100, time.Hour)
	ctx := context.Background()
	err := b.maint.WithConn(ctx, func(c database.DBTX) error {
		tag, err := c.Exec(ctx, `DELETE FROM idempotency_keys`)
		require.Zero(t, tag.RowsAffected())
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 100, b.count(t, "true"))
}
