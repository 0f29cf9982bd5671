package faultproxy_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/faultproxy"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A COMMIT forwarded untouched whose client stops waiting before the reply
// is counted as given up; one answered in time, or one the proxy faulted,
// is not.
func TestCommitsGivenUp(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 3)
	ctx := context.Background()
	u, err := url.Parse(db.AdminURL)
	require.NoError(t, err)
	proxy, err := faultproxy.Start(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	via, err := proxy.Via(db.AdminURL)
	require.NoError(t, err)

	// A COMMIT that takes a second: a deferred trigger sleeps in it.
	admin, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `
		CREATE TABLE slow_commit (id int);
		CREATE FUNCTION sleep_a_second() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON slow_commit DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION sleep_a_second();`)
	require.NoError(t, err)

	commit := func(wait time.Duration, slow bool) error {
		conn, err := pgx.Connect(ctx, via)
		require.NoError(t, err)
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		if slow {
			_, err = tx.Exec(ctx, `INSERT INTO slow_commit VALUES (1)`)
			require.NoError(t, err)
		}
		cctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		return tx.Commit(cctx)
	}
	require.NoError(t, commit(5*time.Second, false))
	require.NoError(t, commit(5*time.Second, true))
	require.Error(t, commit(100*time.Millisecond, true), "the client gives up before the reply")

	proxy.OnCommit(func() faultproxy.Action { return faultproxy.CutBefore })
	require.Error(t, commit(5*time.Second, false), "a fault, not a COMMIT given up")
	proxy.OnCommit(nil)

	// The client cancels the session just after it gave up (pgx does, on
	// its own connection); the proxy counts the COMMIT when that arrives.
	require.Eventually(t, func() bool { return proxy.CommitsGivenUp() == 1 }, 10*time.Second, 10*time.Millisecond,
		"given up: %d, want 1", proxy.CommitsGivenUp())
	time.Sleep(200 * time.Millisecond) // nothing else arrives late
	require.Equal(t, 1, proxy.CommitsGivenUp())
}
