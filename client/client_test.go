package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/client"
)

// These tests pin the client's retry rules against a scripted server: what
// it retries, with which key, how long it waits. The test that runs it
// against the real service through connection cuts is in internal/httpapi
// (TestClientThroughConnectionCuts).

const paymentJSON = `{"id":"01936f4e-8a1c-7b3e-9f2a-4c5d6e7f8a9b","amount":2500,"amount_refunded":0,"currency":"usd",
"status":"processing","failure_reason":null,"description":null,"metadata":{},"livemode":false,"created_at":"2026-12-03T10:15:30Z"}`

// script answers the n-th request (from 0) with answers[n], the last one
// repeated; an answer of status 0 drops the connection without a response.
type script struct {
	mu      sync.Mutex
	answers []answer
	keys    []string
	times   []time.Time
}

type answer struct {
	status     int
	retryAfter string
	body       string
}

func problem(slug string, status int) string {
	return `{"type":"https://payments-reference.dev/problems/` + slug + `","title":"t","status":` + strconv.Itoa(status) + `,"detail":"d","request_id":"req_00000000000000000000000000000000"}`
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.keys)
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	s.times = append(s.times, time.Now())
	a := s.answers[min(n, len(s.answers)-1)]
	s.mu.Unlock()
	if a.status == 0 {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	ct := "application/json"
	if a.status >= 400 {
		ct = "application/problem+json"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

func (s *script) attempts() ([]string, []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]time.Time(nil), s.times...)
}

func start(t *testing.T, policy client.RetryPolicy, answers ...answer) (*client.Client, *script) {
	t.Helper()
	s := &script{answers: answers}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, "sk_test", client.WithRetryPolicy(policy))
	require.NoError(t, err)
	return c, s
}

var fast = client.RetryPolicy{MaxElapsed: 10 * time.Second, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond}

var newPayment = client.NewPayment{Amount: 2500, Currency: "usd"}

// A dropped connection, 409, 429, 500 and 503 are retried, every time with
// the first attempt's key, until the answer is definite.
func TestRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	c, s := start(t, fast,
		answer{status: 0},
		answer{status: 409, body: problem("idempotency-request-in-progress", 409)},
		answer{status: 429, body: problem("idempotency-key-quota-exceeded", 429)},
		answer{status: 500, body: problem("internal-error", 500)},
		answer{status: 503, body: problem("outcome-unknown", 503)},
		answer{status: 201, body: paymentJSON},
	)
	p, err := c.CreatePayment(context.Background(), newPayment)
	require.NoError(t, err)
	require.Equal(t, int64(2500), p.Amount)
	keys, _ := s.attempts()
	require.Len(t, keys, 6)
	for _, k := range keys {
		require.Equal(t, keys[0], k, "every attempt of one intent sends its key")
	}
	require.NotEmpty(t, keys[0])
}

// Each call is a new intent with a new key.
func TestOneKeyPerIntent(t *testing.T) {
	t.Parallel()
	c, s := start(t, fast, answer{status: 201, body: paymentJSON})
	for range 2 {
		_, err := c.CreatePayment(context.Background(), newPayment)
		require.NoError(t, err)
	}
	_, err := c.CreatePayment(context.Background(), newPayment, client.WithIdempotencyKey("order-1042"))
	require.NoError(t, err)
	keys, _ := s.attempts()
	require.Len(t, keys, 3)
	require.NotEqual(t, keys[0], keys[1])
	require.Equal(t, "order-1042", keys[2])
}

// Other 4xx are answers, not failures to get one: one attempt, an *Error.
func TestDoesNotRetryOther4xx(t *testing.T) {
	t.Parallel()
	for _, a := range []answer{
		{status: 400, body: problem("validation-failed", 400)},
		{status: 401, body: problem("unauthenticated", 401)},
		{status: 404, body: problem("not-found", 404)},
		{status: 422, body: problem("idempotency-key-reused", 422)},
		{status: 422, body: problem("too-many-webhook-endpoints", 422)},
	} {
		c, s := start(t, fast, a, answer{status: 201, body: paymentJSON})
		_, err := c.CreatePayment(context.Background(), newPayment)
		var e *client.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, a.status, e.StatusCode)
		keys, _ := s.attempts()
		require.Len(t, keys, 1, "%d %s was retried", a.status, e.Slug())
	}
}

// The wait before a retry is at least the server's Retry-After.
func TestHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	c, s := start(t, fast,
		answer{status: 503, retryAfter: "1", body: problem("service-unavailable", 503)},
		answer{status: 201, body: paymentJSON},
	)
	_, err := c.CreatePayment(context.Background(), newPayment)
	require.NoError(t, err)
	_, times := s.attempts()
	require.Len(t, times, 2)
	require.GreaterOrEqual(t, times[1].Sub(times[0]), time.Second)
}

// At the deadline the caller learns that the payment may exist, and the key
// that will tell.
func TestGivesUpAtTheDeadlineWithTheKey(t *testing.T) {
	t.Parallel()
	c, s := start(t, client.RetryPolicy{MaxElapsed: 200 * time.Millisecond, BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
		answer{status: 0},
		answer{status: 503, body: problem("service-unavailable", 503)},
	)
	_, err := c.CreatePayment(context.Background(), newPayment)
	var re *client.RetryError
	require.ErrorAs(t, err, &re)
	require.True(t, re.MayHaveTakenEffect, "the first attempt's connection dropped after sending")
	keys, _ := s.attempts()
	require.Equal(t, keys[0], re.Key)
	require.Equal(t, len(keys), re.Attempts)
	var last *client.Error
	require.ErrorAs(t, err, &last)
	require.Equal(t, "service-unavailable", last.Slug())

	// A read that never got through has no effect to report.
	c, _ = start(t, client.RetryPolicy{MaxElapsed: 50 * time.Millisecond, BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond}, answer{status: 0})
	_, err = c.GetPayment(context.Background(), uuid.MustParse("01936f4e-8a1c-7b3e-9f2a-4c5d6e7f8a9b"))
	require.ErrorAs(t, err, &re)
	require.False(t, re.MayHaveTakenEffect)
	require.Empty(t, re.Key)
}

// A cancelled context stops the retries at once.
func TestStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	c, _ := start(t, client.RetryPolicy{MaxElapsed: time.Minute, BaseDelay: time.Second, MaxDelay: time.Second},
		answer{status: 503, retryAfter: "30", body: problem("service-unavailable", 503)})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := c.CreatePayment(ctx, newPayment)
	require.Less(t, time.Since(began), 10*time.Second, "waited out a Retry-After past the context's deadline")
	var re *client.RetryError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Attempts, "a Retry-After past the deadline ends the call")
}

// A 201 whose body arrives cut short committed a payment the caller cannot
// see: the client retries with the same key and learns it from the replay,
// and at the deadline says it may have taken effect, with the key. Never a
// plain error a caller could answer with a new key and a second payment.
func TestACutShort2xxIsRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	cut := paymentJSON[:len(paymentJSON)/2]
	c, s := start(t, fast, answer{status: 201, body: cut}, answer{status: 201, body: paymentJSON})
	p, err := c.CreatePayment(context.Background(), newPayment)
	require.NoError(t, err)
	require.Equal(t, "01936f4e-8a1c-7b3e-9f2a-4c5d6e7f8a9b", p.Id.String())
	keys, _ := s.attempts()
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1])

	c, s = start(t, client.RetryPolicy{MaxElapsed: 100 * time.Millisecond, BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
		answer{status: 201, body: cut})
	_, err = c.CreatePayment(context.Background(), newPayment)
	var re *client.RetryError
	require.ErrorAs(t, err, &re)
	require.True(t, re.MayHaveTakenEffect)
	keys, _ = s.attempts()
	require.Equal(t, keys[0], re.Key)
	require.ErrorContains(t, re.Last, "decode 201 response")
}

// A new key is time-ordered (UUIDv7): keys made later sort after earlier
// ones, so the server's unique index takes them at its right edge.
func TestNewIdempotencyKeyIsTimeOrdered(t *testing.T) {
	t.Parallel()
	prev := client.NewIdempotencyKey()
	for range 1000 {
		k := client.NewIdempotencyKey()
		u, err := uuid.Parse(k)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), u.Version())
		require.Greater(t, k, prev)
		prev = k
	}
}
