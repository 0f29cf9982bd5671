package httpapi_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// expire moves a key past its expires_at, as if the window had passed.
func (b *testBundle) expire(t *testing.T, key string) {
	t.Helper()
	_, err := b.admin.Exec(context.Background(),
		`UPDATE idempotency_keys SET created_at = now() - interval '26 hours', expires_at = now() - interval '1 second' WHERE key = $1`, key)
	require.NoError(t, err)
}

// A retry after the window executes as a new request: the expired row is
// taken over by the claim itself, never replayed.
func TestRetryAfterTheWindowIsANewRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	first := b.post(t, "/v1/payments", k.Secret, "late", paymentBody)
	require.Equal(t, http.StatusCreated, first.Status)
	b.expire(t, "late")

	// Even a different body is accepted: the old record no longer counts.
	late := b.post(t, "/v1/payments", k.Secret, "late", `{"amount": 5, "currency": "usd"}`)
	require.Equal(t, http.StatusCreated, late.Status, "body: %s", late.Body)
	require.Empty(t, late.Header.Get("Idempotent-Replayed"))
	require.NotEqual(t, decode(t, first.Body)["id"], decode(t, late.Body)["id"])
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'late' AND expires_at > now() + interval '24 hours'`))

	// And the new record replays as usual.
	again := b.post(t, "/v1/payments", k.Secret, "late", `{"amount": 5, "currency": "usd"}`)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, late.Body, again.Body)
}

// A late retry and the sweeper race for the same expired row. Whatever the
// interleaving, the retry executes exactly once and its new claim survives.
func TestLateRetryRacingTheSweeper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	ctx := context.Background()

	const rounds = 40
	for i := range rounds {
		key := "race-" + itoa(i)
		require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, key, paymentBody).Status)
		b.expire(t, key)

		var wg sync.WaitGroup
		var retry response
		wg.Go(func() { retry = b.post(t, "/v1/payments", k.Secret, key, paymentBody) })
		wg.Go(func() {
			if _, err := b.sweeper.Sweep(ctx); err != nil {
				t.Errorf("sweep: %v", err)
			}
		})
		wg.Wait()

		require.Equal(t, http.StatusCreated, retry.Status, "round %d: %s", i, retry.Body)
		require.Empty(t, retry.Header.Get("Idempotent-Replayed"), "round %d: an expired response was replayed", i)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND expires_at > now()`, key),
			"round %d: the new claim was lost", i)
		// A sweep after the race must not touch the new, live claim either.
		_, err := b.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key))
	}
	require.Equal(t, 2*rounds, b.count(t, `SELECT count(*) FROM payments`), "each key paid once before and once after expiry")
}

func TestKeyQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.keyQuota = 3 })
	k := b.newKey(t, "acme", allScopes...)
	other := b.newKey(t, "globex", allScopes...)

	for i := range 3 {
		require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "q"+itoa(i), paymentBody).Status)
	}
	r := b.post(t, "/v1/payments", k.Secret, "q3", paymentBody)
	requireProblem(t, r, http.StatusTooManyRequests, "idempotency-key-quota-exceeded")
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM payments`))

	// Existing keys still replay, and other principals are unaffected.
	require.Equal(t, "true", b.post(t, "/v1/payments", k.Secret, "q0", paymentBody).Header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", other.Secret, "q3", paymentBody).Status)

	// Counts reach the table on flush, where other instances read them.
	require.NoError(t, b.quota.Flush(context.Background()))
	require.Equal(t, 3, b.count(t, `SELECT claims::int FROM idempotency_key_usage WHERE principal_id = $1`, k.PrincipalID))
}

// An expired key counts as absent on every path, the over-quota one too: a
// principal at its quota retrying a key past the window gets 429, never the
// expired response (nor 422 for a different body).
func TestExpiredKeyIsAbsentWhenOverQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.keyQuota = 1 })
	k := b.newKey(t, "acme", allScopes...)
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "old", paymentBody).Status)
	b.expire(t, "old")

	requireProblem(t, b.post(t, "/v1/payments", k.Secret, "old", paymentBody), http.StatusTooManyRequests, "idempotency-key-quota-exceeded")
	requireProblem(t, b.post(t, "/v1/payments", k.Secret, "old", `{"amount": 7, "currency": "usd"}`), http.StatusTooManyRequests, "idempotency-key-quota-exceeded")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
}

// With a tiny cap, the response is stored as a reference and re-derived on
// replay: the same bytes while the payment is unchanged, its current state
// once it has changed. The request is never executed twice.
func TestLargeResponsesAreStoredAsReferences(t *testing.T) {
	t.Parallel()
	// The processor waits for the test, so the payment is unchanged (still
	// processing) until the byte-for-byte replay has been compared.
	b := setup(t, func(o *options) { o.maxStored = 10; o.holdProcessor = true })
	k := b.newKey(t, "acme", allScopes...)

	first := b.post(t, "/v1/payments", k.Secret, "big", paymentBody)
	require.Equal(t, http.StatusCreated, first.Status)
	var ref string
	var bodyIsNull bool
	require.NoError(t, b.admin.QueryRow(context.Background(),
		`SELECT response_ref, response_body IS NULL FROM idempotency_keys WHERE key = 'big'`).Scan(&ref, &bodyIsNull))
	require.True(t, bodyIsNull)
	id := decode(t, first.Body)["id"].(string)
	require.Equal(t, id, ref)

	again := b.post(t, "/v1/payments", k.Secret, "big", paymentBody)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Status, again.Status)
	require.Equal(t, first.Body, again.Body)

	b.releaseProcessor(t)
	b.settled(t, "/v1/payments/"+id, k.Secret)
	later := b.post(t, "/v1/payments", k.Secret, "big", paymentBody)
	require.Equal(t, http.StatusCreated, later.Status)
	require.Equal(t, "true", later.Header.Get("Idempotent-Replayed"))
	require.Equal(t, "succeeded", decode(t, later.Body)["status"], "a re-derived replay shows the payment as it is now")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
}

// Late retries of one expired key race each other: one takes the row over
// and executes, the others wait for it and replay its answer.
func TestLateRetriesRacingEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 8 })
	k := b.newKey(t, "acme", allScopes...)
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "late", paymentBody).Status)
	b.expire(t, "late")

	const n = 8
	got := make([]response, n)
	concurrently(n, func(i int) { got[i] = b.post(t, "/v1/payments", k.Secret, "late", paymentBody) })
	executed := 0
	for i, r := range got {
		require.Equal(t, http.StatusCreated, r.Status, "retry %d: %s", i, r.Body)
		if r.Header.Get("Idempotent-Replayed") == "" {
			executed++
		}
	}
	require.Equal(t, 1, executed, "exactly one late retry executes")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments`))
}
