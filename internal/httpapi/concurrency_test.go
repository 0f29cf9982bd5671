package httpapi_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// holdAtPaymentInsert makes every payment INSERT of the service wait for an
// advisory lock that the returned connection holds, after the request has
// claimed (or taken over) its key: the request then sits in its transaction
// with the key's row locked, for as long as the test wants. The first fail
// held INSERTs then fail, rolling their requests back. release lets every
// held INSERT go on.
func (b *testBundle) holdAtPaymentInsert(t *testing.T, fail int) (release func()) {
	t.Helper()
	ctx := context.Background()
	// A sequence counts the held INSERTs: nextval is not undone by the
	// rollback it causes, as a counter in a table would be.
	_, err := b.admin.Exec(ctx, `
		CREATE SEQUENCE hold_count;
		GRANT USAGE ON SEQUENCE hold_count TO payments_app;
		CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM pg_advisory_xact_lock(4242);
			IF nextval('hold_count') <= `+strconv.Itoa(fail)+` THEN RAISE EXCEPTION 'the holder fails, as told'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER hold BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION hold();`)
	require.NoError(t, err)
	conn, err := b.admin.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(4242)`)
	require.NoError(t, err)
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
		require.NoError(t, err)
		conn.Release()
	}
	t.Cleanup(release)
	return release
}

// waitUntilBlocked waits until n of the service's sessions wait for the
// named lock (wait_event: advisory, transactionid), as pg_stat_activity
// shows: the requests have reached exactly the point the test means.
func (b *testBundle) waitUntilBlocked(t *testing.T, event string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got int
		err := b.admin.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND usename = 'payments_app' AND wait_event_type = 'Lock' AND wait_event = $1`, event).Scan(&got)
		return err == nil && got == n
	}, time.Minute, 5*time.Millisecond, "never saw %d sessions waiting for lock %q", n, event)
}

// A duplicate arrives while the first request with its key holds the claim
// (or, past the window, has taken the expired row over) and has not
// committed. The duplicate waits on the key's row lock; what it gets then
// depends only on how the holder's transaction ends, never on timing: a
// commit is replayed byte for byte, a rollback frees the key and the
// duplicate executes. Either way the intent executes once. Each case is
// staged with locks and pg_stat_activity, not sleeps.
func TestADuplicateWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// expired: the key exists from an earlier request, past its
		// window, so both requests are late retries racing to take it over.
		expired    bool
		holderFail bool
		// payments made by the two requests (not counting an earlier one).
		wantPayments   int
		wantReplayed   bool
		wantHolderCode int
	}{
		{name: "holder commits: the duplicate replays it", wantPayments: 1, wantReplayed: true, wantHolderCode: http.StatusCreated},
		{name: "holder rolls back: the duplicate executes", holderFail: true, wantPayments: 1, wantReplayed: false, wantHolderCode: http.StatusInternalServerError},
		{name: "late retries: the takeover commits, the other replays it", expired: true, wantPayments: 1, wantReplayed: true, wantHolderCode: http.StatusCreated},
		{name: "late retries: the takeover rolls back, the other takes over", expired: true, holderFail: true, wantPayments: 1, wantReplayed: false, wantHolderCode: http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(o *options) { o.lockTimeout = time.Minute; o.requestTimeout = 2 * time.Minute })
			k := b.newKey(t, "acme", allScopes...)
			earlier := 0
			if tc.expired {
				require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "k", paymentBody).Status)
				b.expire(t, "k")
				earlier = 1
			}
			fail := 0
			if tc.holderFail {
				fail = 1
			}
			release := b.holdAtPaymentInsert(t, fail)

			holder := make(chan response, 1)
			go func() { holder <- b.post(t, "/v1/payments", k.Secret, "k", paymentBody) }()
			b.waitUntilBlocked(t, "advisory", 1) // the holder has claimed the key
			duplicate := make(chan response, 1)
			go func() { duplicate <- b.post(t, "/v1/payments", k.Secret, "k", paymentBody) }()
			b.waitUntilBlocked(t, "transactionid", 1) // the duplicate waits on the holder's row

			release()
			h, d := <-holder, <-duplicate
			require.Equal(t, tc.wantHolderCode, h.Status, "holder: %s", h.Body)
			require.Equal(t, http.StatusCreated, d.Status, "duplicate: %s", d.Body)
			require.Equal(t, tc.wantReplayed, d.Header.Get("Idempotent-Replayed") == "true")
			if tc.wantReplayed {
				require.Equal(t, h.Body, d.Body, "the replay is the holder's response, byte for byte")
			}
			require.Equal(t, earlier+tc.wantPayments, b.count(t, `SELECT count(*) FROM payments`), "the intent executed once")
			require.Equal(t, earlier+tc.wantPayments, b.jobs(t, `kind = 'charge_payment'`), "one charge job per payment")
		})
	}
}

// Two late retries of an expired key both find it expired; one takes it over
// and holds it, the other's takeover UPDATE waits on that row. When the
// holder commits, the waiting UPDATE re-evaluates its WHERE on the new
// version (PostgreSQL's EvalPlanQual): the row is no longer expired, so it
// takes nothing over, and the request replays the holder's response. Without
// "AND expires_at < now()" in the takeover, the second retry would take the
// fresh row over and pay again. The interleaving is staged: the first
// takeover is held before it is sent, and each wait is read from
// pg_stat_activity.
func TestALateRetryRechecksExpiryAfterWaiting(t *testing.T) {
	t.Parallel()
	var paused atomic.Bool
	arrived, gate := make(chan struct{}), make(chan struct{})
	b := setup(t, func(o *options) {
		o.lockTimeout = time.Minute
		o.requestTimeout = 2 * time.Minute
		o.beforeQuery = func(sql string) {
			if strings.Contains(sql, "UPDATE idempotency_keys\nSET state = 'in_progress'") && paused.CompareAndSwap(false, true) {
				close(arrived)
				<-gate
			}
		}
	})
	k := b.newKey(t, "acme", allScopes...)
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "k", paymentBody).Status)
	b.expire(t, "k")
	release := b.holdAtPaymentInsert(t, 0)

	waiter := make(chan response, 1)
	go func() { waiter <- b.post(t, "/v1/payments", k.Secret, "k", paymentBody) }()
	<-arrived // it has seen the row expired and is about to take it over
	holder := make(chan response, 1)
	go func() { holder <- b.post(t, "/v1/payments", k.Secret, "k", paymentBody) }()
	b.waitUntilBlocked(t, "advisory", 1) // the other took the row over and holds it
	close(gate)
	b.waitUntilBlocked(t, "transactionid", 1) // the first one's takeover waits on that row
	release()

	h, w := <-holder, <-waiter
	require.Equal(t, http.StatusCreated, h.Status, "holder: %s", h.Body)
	require.Empty(t, h.Header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusCreated, w.Status, "waiter: %s", w.Body)
	require.Equal(t, "true", w.Header.Get("Idempotent-Replayed"), "the waiter took nothing over: it replays")
	require.Equal(t, h.Body, w.Body)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments`), "the earlier payment and the holder's: the late intent executed once")
}
