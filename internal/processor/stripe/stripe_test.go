package stripe_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/stripe"
)

// fakeStripe answers every call with one canned reply and keeps the requests
// it got: Stripe's answer classes, which stripe-mock (fixtures only) cannot
// produce.
type fakeStripe struct {
	mu       sync.Mutex
	requests []*http.Request
	forms    []url.Values
	status   int
	header   http.Header
	body     string
	// byPath answers a request to its path with its body instead of body.
	byPath map[string]string
}

func (f *fakeStripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, r)
	f.forms = append(f.forms, r.Form)
	f.mu.Unlock()
	if f.status == 0 { // the connection dies without an answer
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range f.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.status)
	body, ok := f.byPath[r.URL.Path]
	if !ok {
		body = f.body
	}
	_, _ = w.Write([]byte(body))
}

func newFake(t *testing.T, status int, body string, header http.Header) (*fakeStripe, *stripe.Processor) {
	t.Helper()
	f := &fakeStripe{status: status, body: body, header: header}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, stripe.New(stripe.Config{SecretKey: "sk_test_fake", URL: srv.URL, PaymentMethod: "pm_card_visa", HTTPClient: &http.Client{Timeout: 5 * time.Second}})
}

const (
	intentSucceeded  = `{"id": "pi_1", "object": "payment_intent", "status": "succeeded"}`
	intentProcessing = `{"id": "pi_1", "object": "payment_intent", "status": "processing"}`
	intentNeedsPM    = `{"id": "pi_1", "object": "payment_intent", "status": "requires_payment_method", "last_payment_error": {"type": "card_error", "code": "card_declined", "decline_code": "do_not_honor"}}`
	intentNeedsSCA   = `{"id": "pi_1", "object": "payment_intent", "status": "requires_action"}`
	intentUncaptured = `{"id": "pi_1", "object": "payment_intent", "status": "requires_capture"}`
)

func stripeError(typ, code, declineCode string) string {
	return `{"error": {"type": "` + typ + `", "code": "` + code + `", "decline_code": "` + declineCode + `", "message": "from the fake"}}`
}

// TestChargeAnswers is the mapping table of docs/external-effects.md: each
// of Stripe's answers to a charge, and the verdict the outbox records.
func TestChargeAnswers(t *testing.T) {
	t.Parallel()
	retry := http.Header{"Stripe-Should-Retry": {"true"}}
	cases := []struct {
		name    string
		status  int
		body    string
		header  http.Header
		verdict processor.Verdict
		reason  string
		id      string
	}{
		{"succeeded", 200, intentSucceeded, nil, processor.Moved, "", "pi_1"},
		{"card declined", 402, stripeError("card_error", "card_declined", "insufficient_funds"), nil, processor.NotMoved, "insufficient_funds", ""},
		{"card error without a decline code", 402, stripeError("card_error", "expired_card", ""), nil, processor.NotMoved, "expired_card", ""},
		{"declined, answered as a payment intent", 200, intentNeedsPM, nil, processor.NotMoved, "do_not_honor", ""},
		{"needs the customer", 200, intentNeedsSCA, nil, processor.NotMoved, "requires_action", ""},
		{"key sent with other parameters", 400, stripeError("idempotency_error", "", ""), nil, processor.NotMoved, processor.ReasonRejected, ""},
		{"invalid request", 400, stripeError("invalid_request_error", "parameter_invalid_integer", ""), nil, processor.NotMoved, processor.ReasonRejected, ""},
		{"invalid request Stripe says to retry", 400, stripeError("invalid_request_error", "", ""), retry, processor.Retry, "", ""},
		{"a concurrent call with the same key", 409, stripeError("idempotency_error", "idempotency_key_in_use", ""), nil, processor.Retry, "", ""},
		{"rate limited", 429, stripeError("invalid_request_error", "rate_limit", ""), nil, processor.Retry, "", ""},
		{"wrong secret key", 401, stripeError("invalid_request_error", "", ""), nil, processor.Retry, "", ""},
		{"Stripe's 500", 500, stripeError("api_error", "", ""), http.Header{"Stripe-Should-Retry": {"false"}}, processor.Retry, "", ""},
		{"still processing", 200, intentProcessing, nil, processor.Retry, "", ""},
		{"authorised, not captured", 200, intentUncaptured, nil, processor.Retry, "", ""},
		{"no answer", 0, "", nil, processor.Retry, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, p := newFake(t, c.status, c.body, c.header)
			res, err := p.Charge(context.Background(), processor.Charge{Key: "intent-key", Amount: 1000, Currency: "eur", Reference: "row-id"})
			verdict, reason := processor.Judge(err, false)
			require.Equal(t, c.verdict, verdict, "error: %v", err)
			require.Equal(t, c.reason, reason)
			require.Equal(t, c.id, res.ID)
			if c.verdict == processor.Retry {
				// On the job's last attempt an unknown outcome is never
				// guessed: the reconciler settles it.
				last, _ := processor.Judge(err, true)
				require.Equal(t, processor.Unknown, last)
			}
		})
	}
}

// TestChargeRequest checks what the adapter sends: the intent's key as
// Stripe's Idempotency-Key and in the metadata, and nothing that changes on
// a retry after a lost commit (the payment's id), which Stripe would refuse
// under the same key.
func TestChargeRequest(t *testing.T) {
	t.Parallel()
	f, p := newFake(t, 200, intentSucceeded, nil)
	_, err := p.Charge(context.Background(), processor.Charge{Key: "intent-key", Amount: 1234, Currency: "eur", Reference: "0193-row-id"})
	require.NoError(t, err)
	require.Len(t, f.requests, 1, "one call per attempt: the outbox retries, not the library")
	r, form := f.requests[0], f.forms[0]
	require.Equal(t, "POST /v1/payment_intents", r.Method+" "+r.URL.Path)
	require.Equal(t, "intent-key", r.Header.Get("Idempotency-Key"))
	require.Equal(t, "Bearer sk_test_fake", r.Header.Get("Authorization"))
	require.Equal(t, "1234", form.Get("amount"))
	require.Equal(t, "eur", form.Get("currency"))
	require.Equal(t, "true", form.Get("confirm"))
	require.Equal(t, "true", form.Get("off_session"))
	require.Equal(t, "pm_card_visa", form.Get("payment_method"))
	require.Equal(t, "intent-key", form.Get("metadata[processor_key]"))
	for k, v := range form {
		require.NotContains(t, v, "0193-row-id", "%s carries the row's id", k)
	}
}

func TestRefund(t *testing.T) {
	t.Parallel()
	t.Run("request", func(t *testing.T) {
		t.Parallel()
		f, p := newFake(t, 200, `{"id": "re_1", "object": "refund", "status": "succeeded"}`, nil)
		res, err := p.Refund(context.Background(), processor.Refund{Key: "refund-key", ChargeKey: "intent-key", ChargeID: "pi_1", Amount: 500, Currency: "eur", Reference: "row"})
		require.NoError(t, err)
		require.Equal(t, "re_1", res.ID)
		r, form := f.requests[0], f.forms[0]
		require.Equal(t, "POST /v1/refunds", r.Method+" "+r.URL.Path)
		require.Equal(t, "refund-key", r.Header.Get("Idempotency-Key"))
		require.Equal(t, "pi_1", form.Get("payment_intent"))
		require.Equal(t, "500", form.Get("amount"))
		require.Equal(t, "refund-key", form.Get("metadata[processor_key]"))
	})
	cases := []struct {
		name    string
		body    string
		verdict processor.Verdict
		reason  string
	}{
		{"pending", `{"id": "re_1", "object": "refund", "status": "pending"}`, processor.Retry, ""},
		{"failed", `{"id": "re_1", "object": "refund", "status": "failed", "failure_reason": "expired_or_canceled_card"}`, processor.NotMoved, "expired_or_canceled_card"},
		{"canceled", `{"id": "re_1", "object": "refund", "status": "canceled"}`, processor.NotMoved, "canceled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, p := newFake(t, 200, c.body, nil)
			_, err := p.Refund(context.Background(), processor.Refund{Key: "refund-key", ChargeID: "pi_1", Amount: 500, Currency: "eur"})
			verdict, reason := processor.Judge(err, false)
			require.Equal(t, c.verdict, verdict, "error: %v", err)
			require.Equal(t, c.reason, reason)
		})
	}
	t.Run("without the charge's id", func(t *testing.T) {
		t.Parallel()
		f, p := newFake(t, 200, `{}`, nil)
		_, err := p.Refund(context.Background(), processor.Refund{Key: "refund-key", Amount: 500, Currency: "eur"})
		verdict, reason := processor.Judge(err, false)
		require.Equal(t, processor.NotMoved, verdict)
		require.Equal(t, processor.ReasonRejected, reason)
		require.Empty(t, f.requests, "nothing sent")
	})
}

func searchPage(intents ...string) string {
	data := ""
	for i, pi := range intents {
		if i > 0 {
			data += ","
		}
		data += pi
	}
	return `{"object": "search_result", "url": "/v1/payment_intents/search", "has_more": false, "data": [` + data + `]}`
}

// TestLookupCharge: the reconciler's question about a charge is a search of
// PaymentIntents by the key in their metadata.
func TestLookupCharge(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		body    string
		verdict processor.Verdict
		reason  string
	}{
		{"charged", searchPage(intentSucceeded), processor.Moved, ""},
		{"declined", searchPage(intentNeedsPM), processor.NotMoved, "do_not_honor"},
		{"no record", searchPage(), processor.NotMoved, processor.ReasonNoRecord},
		{"still processing", searchPage(intentProcessing), processor.Unknown, ""},
		{"two intents with one key", searchPage(intentSucceeded, `{"id": "pi_2", "object": "payment_intent", "status": "succeeded"}`), processor.Unknown, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, p := newFake(t, 200, c.body, nil)
			_, err := p.Lookup(context.Background(), processor.Record{Op: processor.OpCharge, Key: "it's-a-key"})
			verdict, reason := processor.Judge(err, true) // the reconciler's view: no retry within a run
			require.Equal(t, c.verdict, verdict, "error: %v", err)
			require.Equal(t, c.reason, reason)
			r := f.requests[0]
			require.Equal(t, "GET /v1/payment_intents/search", r.Method+" "+r.URL.Path)
			require.Equal(t, `metadata['processor_key']:'it\'s-a-key'`, r.URL.Query().Get("query"))
		})
	}
	t.Run("Stripe cannot say", func(t *testing.T) {
		t.Parallel()
		_, p := newFake(t, 500, stripeError("api_error", "", ""), nil)
		_, err := p.Lookup(context.Background(), processor.Record{Op: processor.OpCharge, Key: "k"})
		verdict, _ := processor.Judge(err, true)
		require.Equal(t, processor.Unknown, verdict, "a lookup Stripe could not answer leaves the row waiting")
	})
}

// TestLookupRefund: a refund is found among its PaymentIntent's refunds.
func TestLookupRefund(t *testing.T) {
	t.Parallel()
	list := `{"object": "list", "url": "/v1/refunds", "has_more": false, "data": [
		{"id": "re_other", "object": "refund", "status": "succeeded", "metadata": {"processor_key": "another-refund"}},
		{"id": "re_1", "object": "refund", "status": "succeeded", "metadata": {"processor_key": "refund-key"}}]}`
	f, p := newFake(t, 200, list, nil)
	res, err := p.Lookup(context.Background(), processor.Record{Op: processor.OpRefund, Key: "refund-key", ChargeID: "pi_1"})
	require.NoError(t, err)
	require.Equal(t, "re_1", res.ID)
	r := f.requests[0]
	require.Equal(t, "GET /v1/refunds", r.Method+" "+r.URL.Path)
	require.Equal(t, "pi_1", r.URL.Query().Get("payment_intent"))

	_, err = p.Lookup(context.Background(), processor.Record{Op: processor.OpRefund, Key: "never-sent", ChargeID: "pi_1"})
	require.ErrorIs(t, err, processor.ErrNoRecord)

	_, err = p.Lookup(context.Background(), processor.Record{Op: processor.OpRefund, Key: "refund-key"})
	verdict, _ := processor.Judge(err, true)
	require.Equal(t, processor.Unknown, verdict, "without the charge's id the refund cannot be found: never \"no record\"")
}

// TestCancelCharge: before "no record" is final the reconciler cancels the
// key; with Stripe, that cancels the key's PaymentIntent if it could still
// move money, and answers about it as a lookup does.
func TestCancelCharge(t *testing.T) {
	t.Parallel()
	canceled := `{"id": "pi_1", "object": "payment_intent", "status": "canceled"}`
	cases := []struct {
		name    string
		found   string
		cancels bool
		verdict processor.Verdict
		reason  string
	}{
		{"charged: nothing undone", searchPage(intentSucceeded), false, processor.Moved, ""},
		{"waiting for the customer: canceled", searchPage(intentNeedsSCA), true, processor.NotMoved, "canceled"},
		{"uncaptured: canceled", searchPage(intentUncaptured), true, processor.NotMoved, "canceled"},
		{"no payment intent", searchPage(), false, processor.NotMoved, processor.ReasonNoRecord},
		{"still processing: cannot say", searchPage(intentProcessing), false, processor.Unknown, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, p := newFake(t, 200, c.found, nil)
			f.byPath = map[string]string{"/v1/payment_intents/pi_1/cancel": canceled}
			_, err := p.Cancel(context.Background(), processor.Record{Op: processor.OpCharge, Key: "k"})
			verdict, reason := processor.Judge(err, true)
			require.Equal(t, c.verdict, verdict, "error: %v", err)
			require.Equal(t, c.reason, reason)
			require.Equal(t, "GET /v1/payment_intents/search", f.requests[0].Method+" "+f.requests[0].URL.Path)
			if !c.cancels {
				require.Len(t, f.requests, 1, "nothing to cancel")
				return
			}
			require.Len(t, f.requests, 2)
			r := f.requests[1]
			require.Equal(t, "POST /v1/payment_intents/pi_1/cancel", r.Method+" "+r.URL.Path)
			require.Equal(t, "cancel-k", r.Header.Get("Idempotency-Key"))
		})
	}
}

// A refused search or list says nothing about the charge or refund it looks
// for: taken as a refusal, the reconciler would record failed a payment
// Stripe may have charged. It leaves the row waiting.
func TestARefusedLookupIsNoAnswer(t *testing.T) {
	t.Parallel()
	for _, op := range []processor.Operation{processor.OpCharge, processor.OpRefund} {
		t.Run(string(op), func(t *testing.T) {
			t.Parallel()
			_, p := newFake(t, 400, stripeError("invalid_request_error", "parameter_invalid", ""), nil)
			_, err := p.Lookup(context.Background(), processor.Record{Op: op, Key: "k", ChargeID: "pi_1"})
			verdict, _ := processor.Judge(err, true)
			require.Equal(t, processor.Unknown, verdict, "error: %v", err)
		})
	}
}
