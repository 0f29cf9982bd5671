package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/reconcile"
)

func TestRefundAPayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)

	r := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund-1", `{"amount": 300, "reason": "requested_by_customer"}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	refund := decode(t, r.Body)
	require.Equal(t, pay, refund["payment_id"])
	require.EqualValues(t, 300, refund["amount"])
	require.Equal(t, "eur", refund["currency"])
	require.Equal(t, "requested_by_customer", refund["reason"])
	require.Equal(t, "pending", refund["status"])
	require.NotEmpty(t, refund["created_at"])

	// Without an amount, a refund takes what remains.
	rest := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund-2", ``)
	require.Equal(t, http.StatusCreated, rest.Status, "body: %s", rest.Body)
	require.EqualValues(t, 700, decode(t, rest.Body)["amount"])

	require.EqualValues(t, 1000, decode(t, b.get(t, "/v1/payments/"+pay, k.Secret).Body)["amount_refunded"])
	got := b.get(t, "/v1/refunds/"+refund["id"].(string), k.Secret)
	require.Equal(t, http.StatusOK, got.Status)
	require.Equal(t, refund["id"], decode(t, got.Body)["id"])
	list := b.listed(t, "/v1/payments/"+pay+"/refunds", k.Secret, 2)
	require.Len(t, list["data"], 2)
	require.Equal(t, false, list["has_more"])
	// A page of one, then the page after it.
	first := decode(t, b.get(t, "/v1/payments/"+pay+"/refunds?limit=1", k.Secret).Body)
	require.Len(t, first["data"], 1)
	require.Equal(t, true, first["has_more"])
	firstID := first["data"].([]any)[0].(map[string]any)["id"].(string)
	require.Equal(t, refund["id"], firstID, "oldest first")
	second := decode(t, b.get(t, "/v1/payments/"+pay+"/refunds?limit=1&starting_after="+firstID, k.Secret).Body)
	require.Len(t, second["data"], 1)
	require.Equal(t, false, second["has_more"])
	require.Equal(t, decode(t, rest.Body)["id"], second["data"].([]any)[0].(map[string]any)["id"])

	var endpoint string
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT endpoint FROM idempotency_keys WHERE key = 'refund-1'`).Scan(&endpoint))
	require.Equal(t, "POST /v1/payments/{id}/refunds", endpoint)
}

// A refund above what remains is a business outcome: stored with state failed
// and replayed byte for byte.
func TestRefundExceedingThePaymentIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)

	first := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "too-much", `{"amount": 1001}`)
	requireProblem(t, first, http.StatusUnprocessableEntity, "refund-exceeds-payment")
	var state string
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT state FROM idempotency_keys WHERE key = 'too-much'`).Scan(&state))
	require.Equal(t, "failed", state)

	again := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "too-much", `{"amount": 1001}`)
	require.Equal(t, first.Status, again.Status)
	require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
	require.Equal(t, first.Body, again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Header.Get("X-Request-Id"), again.Header.Get("X-Original-Request-Id"))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM refunds`))
}

// Many refunds with different keys race on one payment: the row lock makes
// them take turns, so the total never exceeds the payment.
func TestConcurrentRefundsNeverOverRefund(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 8 })
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)

	const n = 30 // each refunds 100 of 1000: exactly 10 can succeed
	statuses := make([]int, n)
	concurrently(n, func(i int) {
		statuses[i] = b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "race-"+itoa(i), `{"amount": 100}`).Status
	})

	created, rejected := 0, 0
	for _, s := range statuses {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusUnprocessableEntity:
			rejected++
		default:
			t.Fatalf("unexpected status %d", s)
		}
	}
	require.Equal(t, 10, created)
	require.Equal(t, n-10, rejected)
	require.Equal(t, 1000, b.count(t, `SELECT sum(amount)::int FROM refunds`))
	require.Equal(t, 1000, b.count(t, `SELECT amount_refunded::int FROM payments`))
}

func TestOneRefundKeySentManyTimesRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 8 })
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)

	const n = 50
	responses := make([]response, n)
	concurrently(n, func(i int) {
		responses[i] = b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "one-refund", `{"amount": 250}`)
	})
	for _, r := range responses {
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		require.Equal(t, responses[0].Body, r.Body)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM refunds`))
	require.Equal(t, 250, b.count(t, `SELECT amount_refunded::int FROM payments`))
}

func TestRefundKeyScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	a := b.createPayment(t, k.Secret, 1000)
	other := b.createPayment(t, k.Secret, 1000)

	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments/"+a+"/refunds", k.Secret, "refund-key", `{"amount": 100}`).Status)
	// Same route template, different payment: the fingerprint covers the
	// concrete path, so this is a reused key, not a replay.
	requireProblem(t, b.post(t, "/v1/payments/"+other+"/refunds", k.Secret, "refund-key", `{"amount": 100}`),
		http.StatusUnprocessableEntity, "idempotency-key-reused")
	// Different endpoint: an independent record.
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "refund-key", paymentBody).Status)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM refunds`))
}

func TestRefundsAcrossTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := b.newKey(t, "acme", allScopes...)
	globex := b.newKey(t, "globex", allScopes...)
	theirs := b.createPayment(t, globex.Secret, 1000)
	theirRefund := decode(t, b.post(t, "/v1/payments/"+theirs+"/refunds", globex.Secret, "g", `{"amount": 100}`).Body)["id"].(string)
	keys := b.count(t, `SELECT count(*) FROM idempotency_keys`)

	requireProblem(t, b.post(t, "/v1/payments/"+theirs+"/refunds", acme.Secret, "steal", `{"amount": 100}`), http.StatusNotFound, "not-found")
	requireProblem(t, b.post(t, "/v1/payments/01a237a6-1ce6-7a98-be43-37d8ff4b5115/refunds", acme.Secret, "ghost", `{}`), http.StatusNotFound, "not-found")
	requireProblem(t, b.get(t, "/v1/payments/"+theirs+"/refunds", acme.Secret), http.StatusNotFound, "not-found")
	requireProblem(t, b.get(t, "/v1/refunds/"+theirRefund, acme.Secret), http.StatusNotFound, "not-found")
	requireProblem(t, b.get(t, "/v1/payments/"+theirs, acme.Secret), http.StatusNotFound, "not-found")

	require.Equal(t, keys, b.count(t, `SELECT count(*) FROM idempotency_keys`), "a 404 stored a key")
	require.Equal(t, 100, b.count(t, `SELECT amount_refunded::int FROM payments`))
}

func TestRefundReplayIsReauthorized(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writer := b.newKey(t, "acme", allScopes...)
	paymentsOnly := b.newKey(t, "acme", auth.ScopePaymentsRead, auth.ScopePaymentsWrite)
	pay := b.createPayment(t, writer.Secret, 1000)
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments/"+pay+"/refunds", writer.Secret, "r", `{"amount": 100}`).Status)

	forbidden := b.post(t, "/v1/payments/"+pay+"/refunds", paymentsOnly.Secret, "r", `{"amount": 100}`)
	requireProblem(t, forbidden, http.StatusForbidden, "forbidden")
	require.Contains(t, decode(t, forbidden.Body)["detail"], `"refunds:write"`, "the 403 names the missing scope")
	_, err := b.admin.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, writer.ID)
	require.NoError(t, err)
	requireProblem(t, b.post(t, "/v1/payments/"+pay+"/refunds", writer.Secret, "r", `{"amount": 100}`), http.StatusUnauthorized, "unauthenticated")

	// The payment changes hands (as an operator could do in the database):
	// the stored refund is no longer the caller's to see.
	fresh := b.newKey(t, "acme", allScopes...)
	// Its refunds go with it, in the same statement: their foreign key
	// names the payment's principal.
	_, err = b.admin.Exec(context.Background(), `
		WITH moved AS (UPDATE payments SET principal_id = $2 WHERE id = $1)
		UPDATE refunds SET principal_id = $2 WHERE payment_id = $1`, pay, uuid.New())
	require.NoError(t, err)
	requireProblem(t, b.post(t, "/v1/payments/"+pay+"/refunds", fresh.Secret, "r", `{"amount": 100}`), http.StatusNotFound, "not-found")
}

func TestInvalidRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)
	for _, body := range []string{`{"amount": 0}`, `{"amount": -1}`, `{"reason": "bored"}`, `{"amount": "1"}`, `{"currency": "usd"}`} {
		requireProblem(t, b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "k", body), http.StatusBadRequest, "validation-failed")
	}
	requireProblem(t, b.post(t, "/v1/payments/not-a-uuid/refunds", k.Secret, "k", `{}`), http.StatusNotFound, "not-found")
	requireProblem(t, b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "", `{}`), http.StatusBadRequest, "idempotency-key-missing")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`), "only the payment's key")
}

// A refund is pending until the processor answers. One the processor
// refuses ends failed, and gives its amount back to the payment.
func TestRefundTheProcessorRefusesGivesItsAmountBack(t *testing.T) {
	t.Parallel()
	// The processor waits for the test, so the refund is still pending when
	// the payment is read.
	b := setup(t, func(o *options) { o.holdProcessor = true })
	k := b.newKey(t, "acme", allScopes...)
	// A payment the processor never charged (as if recorded by hand), so the
	// processor refuses to refund it.
	id := uuid.Must(uuid.NewV7())
	_, err := b.admin.Exec(context.Background(), `
		INSERT INTO payments (id, principal_id, amount, currency, status, created_at, processor_key) VALUES ($1, $2, 1000, 'eur', 'succeeded', now(), gen_random_uuid()::text)`,
		id, k.PrincipalID)
	require.NoError(t, err)

	r := b.post(t, "/v1/payments/"+id.String()+"/refunds", k.Secret, "refund", `{"amount": 400}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	refund := decode(t, r.Body)
	require.Equal(t, "pending", refund["status"])
	require.EqualValues(t, 400, decode(t, b.get(t, "/v1/payments/"+id.String(), k.Secret).Body)["amount_refunded"], "a pending refund counts")

	b.releaseProcessor(t)
	got := b.settled(t, "/v1/refunds/"+refund["id"].(string), k.Secret)
	require.Equal(t, "failed", got["status"])
	require.Equal(t, "processor_rejected", got["failure_reason"])
	require.EqualValues(t, 0, decode(t, b.get(t, "/v1/payments/"+id.String(), k.Secret).Body)["amount_refunded"], "given back")
	require.Zero(t, b.sim.EffectsFor(refund["id"].(string)))
}

// A refund of a payment that is still being charged, or waiting for
// reconciliation, is refused for now (409, nothing recorded); one of a
// payment that failed is a stored 422.
func TestRefundOfAnUnchargedPayment(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	k := b.newKey(t, "acme", allScopes...)
	r := b.post(t, "/v1/payments", k.Secret, "pay", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status)
	id := decode(t, r.Body)["id"].(string)

	processing := b.post(t, "/v1/payments/"+id+"/refunds", k.Secret, "refund", `{"amount": 100}`)
	requireProblem(t, processing, http.StatusConflict, "payment-processing")
	require.Equal(t, "1", processing.Header.Get("Retry-After"))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM refunds`))

	_, err := b.admin.Exec(context.Background(), `UPDATE payments SET status = 'requires_reconciliation' WHERE id = $1`, id)
	require.NoError(t, err)
	requireProblem(t, b.post(t, "/v1/payments/"+id+"/refunds", k.Secret, "refund", `{"amount": 100}`),
		http.StatusConflict, "payment-processing")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM refunds`))

	_, err = b.admin.Exec(context.Background(), `UPDATE payments SET status = 'failed', failure_reason = 'card_declined' WHERE id = $1`, id)
	require.NoError(t, err)
	failed := b.post(t, "/v1/payments/"+id+"/refunds", k.Secret, "refund", `{"amount": 100}`)
	requireProblem(t, failed, http.StatusUnprocessableEntity, "payment-not-refundable")
	replay := b.post(t, "/v1/payments/"+id+"/refunds", k.Secret, "refund", `{"amount": 100}`)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.Equal(t, failed.Body, replay.Body)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM refunds`))
}

// A refund of a payment already refunded in full says so, rather than that
// a refund of 0 exceeds the 0 that remains.
func TestRefundOfAFullyRefundedPayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)
	r := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "all", `{}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.EqualValues(t, 1000, decode(t, r.Body)["amount"])
	r = b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "again", `{}`)
	requireProblem(t, r, http.StatusUnprocessableEntity, "refund-exceeds-payment")
	require.Contains(t, decode(t, r.Body)["detail"], "refunded in full")
}

// A refund whose outcome stays unknown keeps its amount counted against the
// payment (the money may have gone back to the customer), so what remains
// cannot be refunded twice; the reconciler settles it from the ledger.
func TestAnUnknownRefundKeepsItsAmountCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxAttempts = 2 })
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)

	b.sim.SetConfig(simulator.Config{DropRate: 1})
	r := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund-1", `{"amount": 400}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	refund := decode(t, r.Body)["id"].(string)
	require.Equal(t, "requires_reconciliation", b.settled(t, "/v1/refunds/"+refund, k.Secret)["status"])
	require.EqualValues(t, 400, decode(t, b.get(t, "/v1/payments/"+pay, k.Secret).Body)["amount_refunded"], "not given back")

	requireProblem(t, b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund-2", `{"amount": 1000}`),
		http.StatusUnprocessableEntity, "refund-exceeds-payment")

	b.sim.SetConfig(simulator.Config{})
	lookups := &recordedLookups{Processor: b.reconciler.Processor}
	b.reconciler.Processor = lookups
	res, err := b.reconciler.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Examined: 1, Succeeded: 1}, res)
	require.Equal(t, "succeeded", decode(t, b.get(t, "/v1/refunds/"+refund, k.Secret).Body)["status"])
	// The lookup names the refund's charge by the processor's id, which a
	// processor such as Stripe finds refunds by (migration 19).
	var chargeID string
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT processor_id FROM payments WHERE id = $1`, pay).Scan(&chargeID))
	require.NotEmpty(t, chargeID)
	require.Equal(t, []processor.Record{{Op: processor.OpRefund, Key: lookups.records[0].Key, ChargeID: chargeID}}, lookups.records)
	require.EqualValues(t, 400, decode(t, b.get(t, "/v1/payments/"+pay, k.Secret).Body)["amount_refunded"])
	require.Equal(t, 1, b.sim.EffectsFor(refund))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM refunds`), "the refused refund recorded nothing")
}

// A refund's retry spelled differently (the payment's id in capitals, the
// key quoted) is the same request, replayed, as for a payment
// (TestEverySpellingOfARetryIsTheSameRequest).
func TestEverySpellingOfARefundRetryIsTheSameRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)
	refund := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund-7", `{"amount": 100}`)
	require.Equal(t, http.StatusCreated, refund.Status, "body: %s", refund.Body)
	for _, c := range []call{
		{path: "/v1/payments/" + strings.ToUpper(pay) + "/refunds", key: "refund-7", offSpec: true},
		{path: "/v1/payments/" + pay + "/refunds", key: `"refund-7"`},
	} {
		c.method, c.secret, c.body = http.MethodPost, k.Secret, `{"amount": 100}`
		again := b.do(t, c)
		require.Equal(t, http.StatusCreated, again.Status, "%s %q: %s", c.path, c.key, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "%s %q", c.path, c.key)
		require.Equal(t, refund.Body, again.Body)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM refunds`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idempotency_keys`), "the payment's and the refund's")
}

// A processor's over-long, non-UTF-8, NUL-containing refusal of a refund is
// recorded as the column can hold it, and the refund settles
// (TestProcessorsOddAnswersStillSettle for charges).
func TestRefundProcessorsOddAnswersStillSettle(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) {
		o.processor = func(sim http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && r.URL.Path == "/v1/refunds" {
					w.WriteHeader(http.StatusPaymentRequired)
					_ = json.NewEncoder(w).Encode(map[string]string{"error": badText})
					return
				}
				sim.ServeHTTP(w, r)
			})
		}
	})
	k := b.newKey(t, "acme", allScopes...)
	charged := b.createPayment(t, k.Secret, 1000)
	r := b.post(t, "/v1/payments/"+charged+"/refunds", k.Secret, "refund", `{"amount": 100}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	refund := b.settled(t, "/v1/refunds/"+decode(t, r.Body)["id"].(string), k.Secret)
	require.Equal(t, "failed", refund["status"])
	requireStorable(t, refund["failure_reason"].(string))
}

// A refund's response too large to store is stored as a reference and
// re-derived on replay, showing the refund as it is now
// (TestLargeResponsesAreStoredAsReferences for payments).
func TestLargeRefundResponsesAreStoredAsReferences(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxStored = 10 })
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)
	first := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund", `{"amount": 100}`)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	id := decode(t, first.Body)["id"].(string)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE key = 'refund' AND response_body IS NULL AND response_ref = $1`, id))
	b.settled(t, "/v1/refunds/"+id, k.Secret)

	replay := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund", `{"amount": 100}`)
	require.Equal(t, http.StatusCreated, replay.Status)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.Equal(t, "succeeded", decode(t, replay.Body)["status"], "a re-derived replay shows the refund as it is now")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM refunds`))
}
