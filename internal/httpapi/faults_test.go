package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/faultproxy"
)

// postCutInTrigger sends a payment while trigger (a CREATE TRIGGER naming
// "stall" on payments, which calls stall()) puts the service's backend to
// sleep, terminates that backend as a network cut or a failover would, and
// returns what the client saw. The trigger is gone afterwards.
func (b *testBundle) postCutInTrigger(t *testing.T, secret, key, trigger string) response {
	t.Helper()
	ctx := context.Background()
	_, err := b.admin.Exec(ctx, `CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(30); RETURN NEW; END $$;`+trigger)
	require.NoError(t, err)

	// b.post fails the test from its goroutine by ending it, so the result
	// is awaited with a bound rather than forever.
	done := make(chan response, 1)
	go func() { done <- b.post(t, "/v1/payments", secret, key, paymentBody) }()
	require.Eventually(t, func() bool {
		var n int
		err := b.admin.QueryRow(ctx, `
			SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE usename = 'payments_app' AND datname = current_database() AND wait_event = 'PgSleep'`).Scan(&n)
		return err == nil && n == 1
	}, 20*time.Second, 10*time.Millisecond, "the service's backend never reached the trigger's sleep")
	var r response
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("no response after the connection was cut")
	}

	_, err = b.admin.Exec(ctx, `DROP TRIGGER stall ON payments`)
	require.NoError(t, err)
	return r
}

// A connection lost mid-request. Before COMMIT was sent nothing can have
// committed: 503 service-unavailable, "no effect". After COMMIT was sent the
// service cannot know: 503 outcome-unknown, never "no effect" (here the
// deferred trigger runs inside COMMIT and the backend dies in it, so nothing
// committed). Either way the retry with the same key executes once.
func TestConnectionLostMidRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, trigger, slug string
	}{
		{"before COMMIT: no effect", `CREATE TRIGGER stall BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION stall();`, "service-unavailable"},
		{"during COMMIT: outcome unknown", `CREATE CONSTRAINT TRIGGER stall AFTER INSERT ON payments
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall();`, "outcome-unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			k := b.newKey(t, "acme", allScopes...)
			r := b.postCutInTrigger(t, k.Secret, "k", tc.trigger)
			requireProblem(t, r, http.StatusServiceUnavailable, tc.slug)
			require.Equal(t, "1", r.Header.Get("Retry-After"))
			require.Contains(t, decode(t, r.Body)["detail"], "same Idempotency-Key")
			if tc.slug == "outcome-unknown" {
				require.NotContains(t, decode(t, r.Body)["detail"], "no effect")
			}

			again := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
			require.Equal(t, http.StatusCreated, again.Status, "body: %s", again.Body)
			require.Empty(t, again.Header.Get("Idempotent-Replayed"), "nothing had committed: the retry executes")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`))
		})
	}
}

// A client that sends its body too slowly for the server's ReadTimeout made
// the mistake, not the server: 408 request-timeout, no ERROR in the log,
// nothing claimed, and the same key then works.
func TestSlowBodyIs408(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	srv := httptest.NewUnstartedServer(b.handler)
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)

	body, stall := io.Pipe()
	t.Cleanup(func() { stall.Close() })
	go func() { _, _ = stall.Write([]byte(`{"amount":`)) }()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+k.Secret)
	req.Header.Set("Idempotency-Key", "slow")
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{Status: resp.StatusCode, Header: resp.Header, Body: got}
	checkContract(t, req, r)
	requireProblem(t, r, http.StatusRequestTimeout, "request-timeout")
	require.NotContains(t, b.logs.String(), `"level":"ERROR"`)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idempotency_keys`))

	again := b.post(t, "/v1/payments", k.Secret, "slow", paymentBody)
	require.Equal(t, http.StatusCreated, again.Status, "body: %s", again.Body)
}

// A holder that vanishes behind a half-open connection, with its COMMIT lost
// on the way, leaves PostgreSQL holding the claim's row lock in a transaction
// nobody will finish. The pool's idle_in_transaction_session_timeout ends it:
// the key is locked (409) only until then, and the retry then executes once.
// Without the timeout the retries get 409 until TCP gives up, hours later.
func TestVanishedHolderFreesTheKeyWithinTheBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: waits out a 3 s idle-in-transaction bound; the full test command (and CI) runs it")
	}
	t.Parallel()
	const idleInTx = 3 * time.Second
	b := setup(t, func(o *options) {
		o.faultProxy = true
		o.noWorkers = true // only the request's COMMIT goes through the proxy
		o.idleInTx = idleInTx
		// Room for the request to reach its COMMIT on a loaded machine (at
		// 1 s, under the whole suite, its first batch once ran out of time
		// before the COMMIT, and it answered "no effect").
		o.requestTimeout = 3 * time.Second
		// The COMMIT lost on the way is given up well within the idle
		// bound, so that retries meet the key it holds (the default 3 s
		// would end with the bound).
		o.commitTimeout = 500 * time.Millisecond
		o.lockTimeout = 300 * time.Millisecond
	})
	k := b.newKey(t, "acme", allScopes...)
	var once sync.Once
	b.proxy.OnCommit(func() faultproxy.Action {
		action := faultproxy.Forward
		once.Do(func() { action = faultproxy.HalfOpen })
		return action
	})

	first := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	requireProblem(t, first, http.StatusServiceUnavailable, "outcome-unknown")
	require.Equal(t, 1, b.proxy.Held(), "the database side is held open")

	locked := 0
	deadline := time.Now().Add(idleInTx + 10*time.Second)
	var r response
	for time.Now().Before(deadline) {
		r = b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
		if r.Status != http.StatusConflict {
			break
		}
		locked++
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, http.StatusCreated, r.Status, "the key was still locked %s after its holder vanished; body: %s", idleInTx+10*time.Second, r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"), "the lost COMMIT never reached the server")
	require.Positive(t, locked, "the vanished holder never held the key: the fault was not injected")
	// The server ended the abandoned session: its locks went with the
	// transaction, which is why the retry got through; the proxy sees the
	// socket close a moment later, so that is waited for, not raced.
	require.Eventually(t, func() bool { return b.proxy.Held() == 0 }, 10*time.Second, 10*time.Millisecond,
		"the server did not end the abandoned session")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
}

// A client that gives up mid-request is not a server fault: no ERROR line,
// no 500 counted, and the claim rolled back with the cancelled statement.
func TestClientGoneIsNotAServerFault(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	k := b.newKey(t, "acme", allScopes...)
	_, err := b.admin.Exec(context.Background(), `
		CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$;
		CREATE TRIGGER stall BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION stall();`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/v1/payments", strings.NewReader(paymentBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+k.Secret)
	req.Header.Set("Idempotency-Key", "gone")
	req.Header.Set("Content-Type", "application/json")
	_, err = b.srv.Client().Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), "client went away") }, 5*time.Second, 10*time.Millisecond)
	require.NotContains(t, b.logs.String(), `"level":"ERROR"`)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}
