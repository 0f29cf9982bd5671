package database_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// openPool opens a pool as the database owner, which may create tables.
func openPool(t *testing.T) *database.Pool {
	t.Helper()
	db := testdb.New(t, 4)
	pool, err := database.Open(context.Background(), db.OwnerURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// dieBeforeCommit makes the server end the session while fn's caller is
// still holding the transaction open, so COMMIT meets a dead backend.
func dieBeforeCommit(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 50`); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	return nil
}

// A read-only transaction cannot have had an effect, so losing it at COMMIT
// is a plain "unavailable": the read is retried. A read-write one lost at
// COMMIT is an unknown outcome, which must never be reported as "no effect".
func TestCommitFailureIsUnknownOnlyForWrites(t *testing.T) {
	t.Parallel()
	pool := openPool(t)
	ctx := context.Background()
	for _, readOnly := range []bool{true, false} {
		err := database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{ReadOnly: readOnly}, func(tx pgx.Tx) error {
			return dieBeforeCommit(ctx, tx)
		})
		require.Error(t, err)
		if readOnly {
			require.ErrorIs(t, err, database.ErrUnavailable)
			require.NotErrorIs(t, err, database.ErrOutcomeUnknown)
		} else {
			require.ErrorIs(t, err, database.ErrOutcomeUnknown)
		}
	}
}

// A session the server ended before COMMIT (idle_in_transaction timeout,
// a terminated backend) rolled back: the next statement's FATAL is 503 with
// "no effect", not a 500.
func TestFatalBeforeCommitIsUnavailable(t *testing.T) {
	t.Parallel()
	pool := openPool(t)
	ctx := context.Background()
	err := database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{}, func(tx pgx.Tx) error {
		if err := dieBeforeCommit(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT 1`)
		return database.Classify(err)
	})
	require.ErrorIs(t, err, database.ErrUnavailable)
	require.NotErrorIs(t, err, database.ErrOutcomeUnknown)
}

// A connection that met 25006 is dropped, not pooled: its server is a
// standby now, and every request on it would fail the same way.
func TestConnectionToAStandbyIsDropped(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 4)
	pool, err := database.Open(context.Background(), db.OwnerURL, database.PoolConfig{MaxConns: 1, AcquireTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	backend := func() (pid int) {
		require.NoError(t, pool.WithConn(ctx, func(c database.DBTX) error {
			return c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
		}))
		return pid
	}
	before := backend()
	require.Equal(t, before, backend(), "the pool of one keeps its connection")
	err = database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL transaction_read_only = on; CREATE TABLE t (x int)`)
		return err
	})
	require.ErrorIs(t, err, database.ErrUnavailable)
	require.NotEqual(t, before, backend(), "the connection that met 25006 went back to the pool")
}

// The COMMIT's own bound running out while the server commits leaves the
// outcome unknown. Here it did not commit: giving up, pgx sends a cancel
// request, which stops the deferred trigger. A cancel that arrives once the
// commit record is written changes nothing, and the client cannot tell the
// two apart, so the label must be "unknown" either way. (The request's own
// deadline no longer cancels a COMMIT: TestCommitOutlivesItsRequest.)
func TestTimeoutDuringCommitIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 4)
	pool, err := database.Open(context.Background(), db.OwnerURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: 10 * time.Second,
		CommitTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	require.NoError(t, database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			CREATE TABLE t (x int);
			CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
			CREATE CONSTRAINT TRIGGER stall AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall();`)
		return err
	}))

	err = database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
		return err
	})
	require.ErrorIs(t, err, database.ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A connection that outlived a failover may find its server a standby now:
// a write there fails with read_only_sql_transaction, which had no effect
// and is a 503 to retry (on the new primary), not a 500.
// A read-only transaction stands in for the standby: the server sends the
// same SQLSTATE.
func TestWriteOnAStandbyIsUnavailable(t *testing.T) {
	t.Parallel()
	pool := openPool(t)
	ctx := context.Background()
	require.NoError(t, database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE t (x int)`)
		return err
	}))
	err := database.InTenantTx(ctx, pool, uuid.New(), database.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL transaction_read_only = on`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
		return err
	})
	require.ErrorIs(t, err, database.ErrUnavailable)
	require.NotErrorIs(t, err, database.ErrOutcomeUnknown)
}

// slowCommit makes the test database's COMMITs of a row in slow_commit
// take a second (a deferred trigger sleeps in them), or say what a COMMIT
// whose wait for a synchronous standby was cancelled says.
func slowCommit(t *testing.T, adminURL, body string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `
		CREATE TABLE slow_commit (id int);
		GRANT INSERT, SELECT ON slow_commit TO payments_app;
		CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+body+`; RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON slow_commit DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION at_commit();`)
	require.NoError(t, err)
}

// A request that goes away while its COMMIT runs does not cancel it: the
// COMMIT finishes, and its transaction is committed. (Cancelled halfway, a
// COMMIT waiting for a synchronous standby stays committed on the primary
// only, and a failover loses it.)
func TestCommitOutlivesItsRequest(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 4)
	slowCommit(t, db.AdminURL, `PERFORM pg_sleep(1)`)
	pool, err := database.Open(context.Background(), db.AppURL, database.PoolConfig{MaxConns: 1, AcquireTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = database.InTx(ctx, pool, database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO slow_commit VALUES (1)`)
		// The request goes away now, whatever the machine's speed: before
		// its COMMIT, which then takes a second.
		cancel()
		return err
	})
	require.NoError(t, err, "the COMMIT ran to its end after the request was cancelled")
	var n int
	require.NoError(t, pool.WithConn(context.Background(), func(c database.DBTX) error {
		return c.QueryRow(context.Background(), `SELECT count(*) FROM slow_commit`).Scan(&n)
	}))
	require.Equal(t, 1, n)
}

// A COMMIT that PostgreSQL answers with "canceling wait for synchronous
// replication" is committed on the primary, perhaps not on the standby: an
// unknown outcome, counted, never a success.
func TestCommitWithoutTheStandbyIsAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 4)
	// What PostgreSQL says, raised at COMMIT by the trigger.
	slowCommit(t, db.AdminURL, `RAISE WARNING 'canceling wait for synchronous replication due to user request'`)
	reader := sdkmetric.NewManualReader()
	pool, err := database.Open(context.Background(), db.AppURL, database.PoolConfig{MaxConns: 1, AcquireTimeout: 10 * time.Second,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	err = database.InTx(ctx, pool, database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO slow_commit VALUES (1)`)
		return err
	})
	require.ErrorIs(t, err, database.ErrOutcomeUnknown)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	var counted int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "db_commit_outcome_unknown" {
				for _, p := range d.DataPoints {
					if r, _ := p.Attributes.Value("reason"); r.AsString() == "sync_replication" {
						counted += p.Value
					}
				}
			}
		}
	}
	require.EqualValues(t, 1, counted)

	// The next transaction on the connection is not taken for one.
	require.NoError(t, database.InTx(ctx, pool, database.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}))
}
