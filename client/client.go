// Package client is a Go client for the payments API that keeps the
// client's half of the idempotency contract: one Idempotency-Key per
// intent, sent unchanged on every attempt, and retries only where a retry
// with that key is safe and can change the answer.
//
// The models and the plain HTTP calls (RawClient) are generated from
// openapi.yaml by oapi-codegen (go generate ./client); this file is the thin
// layer on top that decides what to retry:
//
//   - a network error, a 2xx whose body arrived cut short or unreadable,
//     and 408, 409, 429, 500, 502, 503 and 504 are retried with the same
//     key, waiting at least Retry-After and otherwise a jittered
//     exponential backoff, until the call's deadline;
//   - every other 4xx is returned at once as an *Error: sending the same
//     request again will not change it, and sending it with a new key
//     could charge twice;
//   - when the deadline comes first, the error is a *RetryError that says
//     whether the request may have taken effect and carries the key, so
//     the caller can try again later with WithIdempotencyKey(key) and learn
//     the outcome instead of guessing.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// RetryPolicy bounds the attempts of one call.
type RetryPolicy struct {
	// MaxElapsed is how long one call may keep retrying, counted from its
	// first attempt; the context's deadline, when earlier, wins. Keep it well
	// inside the API's 24-hour retry window.
	MaxElapsed time.Duration
	// MaxAttempts caps the attempts; 0 means as many as MaxElapsed allows,
	// 1 means no retries.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: attempt n waits a random
	// time up to min(MaxDelay, BaseDelay*2^n), and never less than the
	// server's Retry-After.
	BaseDelay time.Duration
	MaxDelay  time.Duration
}

// DefaultRetryPolicy retries for up to a minute.
var DefaultRetryPolicy = RetryPolicy{MaxElapsed: time.Minute, BaseDelay: 100 * time.Millisecond, MaxDelay: 5 * time.Second}

// Attempt is one HTTP exchange of a call, as reported to an attempt hook.
type Attempt struct {
	Method string
	Path   string
	// Key is the call's Idempotency-Key, or "" for a read.
	Key string
	// N counts the call's attempts from 1.
	N int
	// StatusCode is 0 when no response arrived (Err is set).
	StatusCode int
	Header     http.Header
	Err        error
	Duration   time.Duration
}

// Client calls the payments API. It is safe for concurrent use.
type Client struct {
	raw    *RawClient
	apiKey string
	policy RetryPolicy
	hook   func(Attempt)
}

// Option configures a Client.
type Option func(*Client)

// UseHTTPClient sends requests through h instead of a client with a
// 30-second timeout per attempt.
func UseHTTPClient(h HttpRequestDoer) Option { return func(c *Client) { c.raw.Client = h } }

// WithRetryPolicy replaces DefaultRetryPolicy.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.policy = p } }

// WithAttemptHook calls hook after every attempt, retried or not: for
// logging, metrics, or reading a response header.
func WithAttemptHook(hook func(Attempt)) Option { return func(c *Client) { c.hook = hook } }

// New returns a Client for the API at baseURL (for example
// http://localhost:8080) that authenticates with the API key secret.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	raw, err := NewClient(baseURL, WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c := &Client{raw: raw, apiKey: apiKey, policy: DefaultRetryPolicy}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// CallOption configures one call.
type CallOption func(*callOptions)

type callOptions struct {
	key  string
	hook func(Attempt)
}

// WithIdempotencyKey sends key instead of a new one. Use it when the
// intent outlives the call: a key stored with the order before the first
// attempt, or the key of a RetryError, lets a later call (after a crash, say)
// learn what the first one did instead of doing it again.
func WithIdempotencyKey(key string) CallOption { return func(o *callOptions) { o.key = key } }

// OnAttempt calls hook after each of this call's attempts, besides the
// client's own hook: to read a response header, say.
func OnAttempt(hook func(Attempt)) CallOption { return func(o *callOptions) { o.hook = hook } }

// NewIdempotencyKey makes a key for a new intent: a UUIDv7, whose first 48
// bits are the time it was made. The server's unique index then takes each
// new key at the right edge of the caller's part of it, which stays in
// memory however large the table grows; a random key lands on any page and,
// past the size where the index fits in memory, reads one in from disk and
// writes a full-page image of it to the WAL (docs/idempotency.md, "What a
// client must do"). Its other 74 bits are random: no one guesses it, and a key
// only ever means something within its own principal's scope.
func NewIdempotencyKey() string { return uuid.Must(uuid.NewV7()).String() }

// CreatePayment creates one payment for this intent, however many attempts
// it takes. The payment is processing until the processor answers; read its
// final status with GetPayment.
func (c *Client) CreatePayment(ctx context.Context, p NewPayment, opts ...CallOption) (*Payment, error) {
	o := options(true, opts)
	key := o.key
	var out Payment
	err := c.call(ctx, o, http.MethodPost, "/v1/payments", &out, func() (*http.Request, error) {
		return NewCreatePaymentRequest(c.raw.Server, &CreatePaymentParams{IdempotencyKey: key}, p)
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// GetPayment reads a payment.
func (c *Client) GetPayment(ctx context.Context, id uuid.UUID, opts ...CallOption) (*Payment, error) {
	var out Payment
	if err := c.call(ctx, options(false, opts), http.MethodGet, "/v1/payments/{id}", &out, func() (*http.Request, error) {
		return NewGetPaymentRequest(c.raw.Server, id.String())
	}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListPayments reads one page of payments; params may be nil.
func (c *Client) ListPayments(ctx context.Context, params *ListPaymentsParams, opts ...CallOption) (*PaymentList, error) {
	var out PaymentList
	if err := c.call(ctx, options(false, opts), http.MethodGet, "/v1/payments", &out, func() (*http.Request, error) {
		return NewListPaymentsRequest(c.raw.Server, params)
	}); err != nil {
		return nil, err
	}
	return &out, nil
}

// options applies opts; a write without WithIdempotencyKey gets a new key,
// its intent's for every attempt.
func options(write bool, opts []CallOption) callOptions {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	if write && o.key == "" {
		o.key = NewIdempotencyKey()
	}
	return o
}

// Error is an answer the API gave as a problem document, that the client
// did not retry (or the last one, inside a RetryError). Branch on Type.
type Error struct {
	Problem
	// StatusCode is the HTTP status, which Problem.Status repeats.
	StatusCode int
	// Replayed is true when the answer was stored by an earlier attempt with
	// the same key: a refund-exceeds-payment, say.
	Replayed bool
}

// Error renders the problem's type and detail.
func (e *Error) Error() string {
	return fmt.Sprintf("payments API: %d %s: %s", e.StatusCode, e.Slug(), e.Detail)
}

// Slug is the stable last part of the problem type, such as
// "refund-exceeds-payment".
func (e *Error) Slug() string {
	t := string(e.Type)
	return t[strings.LastIndexByte(t, '/')+1:]
}

// RetryError means the call's deadline (or MaxAttempts) came before a
// definite answer.
type RetryError struct {
	// Key is the call's Idempotency-Key ("" for a read). Retry the intent
	// with WithIdempotencyKey(Key), never with a new key, while
	// MayHaveTakenEffect is true.
	Key string
	// MayHaveTakenEffect is true when some attempt was sent and got no
	// definite "no effect": a network error after sending, 503
	// outcome-unknown, or a 2xx whose body could not be read.
	MayHaveTakenEffect bool
	Attempts           int
	// Last is the last attempt's error: an *Error, a network error or the
	// context's error.
	Last error
}

// Error summarises the attempts.
func (e *RetryError) Error() string {
	return fmt.Sprintf("payments API: gave up after %d attempts (may have taken effect: %t): %v", e.Attempts, e.MayHaveTakenEffect, e.Last)
}

// Unwrap returns the last attempt's error.
func (e *RetryError) Unwrap() error { return e.Last }

// retryable are the statuses a retry with the same key can change: the
// other request finished (409), the quota freed up (429), the body arrived
// (408), the database is back (5xx).
func retryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// call runs attempts of one request until a definite answer, decoding a 2xx
// into out.
func (c *Client) call(ctx context.Context, o callOptions, method, path string, out any, build func() (*http.Request, error)) error {
	key := o.key
	start := time.Now()
	deadline := start.Add(c.policy.MaxElapsed)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	maybe := false
	var last error
	for n := 1; ; n++ {
		bodyLost := false
		req, err := build()
		if err != nil {
			return fmt.Errorf("payments API: build request: %w", err)
		}
		req = req.WithContext(ctx)
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
		began := time.Now()
		resp, err := c.raw.Client.Do(req)
		var retryAfter time.Duration
		var status int
		var header http.Header
		if err != nil {
			// The request may have reached the server and committed before
			// the connection failed; only a write can have an effect.
			maybe = maybe || key != ""
			last = err
		} else {
			status, header = resp.StatusCode, resp.Header
			last = decode(resp, out)
			retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
			var pe *Error
			switch {
			case errors.As(last, &pe) && pe.Slug() == "outcome-unknown":
				maybe = true
			case last != nil && status >= 200 && status < 300:
				// A 2xx whose body was cut short or unreadable: the request
				// took effect, and only a retry with the same key (a replay)
				// can say what it made. Never a plain error, which a caller
				// could take as "failed" and retry with a new key.
				bodyLost = true
				maybe = maybe || key != ""
			}
		}
		a := Attempt{Method: method, Path: path, Key: key, N: n, StatusCode: status, Header: header, Err: err, Duration: time.Since(began)}
		for _, hook := range []func(Attempt){c.hook, o.hook} {
			if hook != nil {
				hook(a)
			}
		}
		if err == nil && !retryable(status) && !bodyLost {
			return last // nil for a 2xx
		}
		if ctx.Err() != nil {
			return &RetryError{Key: key, MayHaveTakenEffect: maybe, Attempts: n, Last: ctx.Err()}
		}
		wait := max(retryAfter, c.backoff(n))
		if (c.policy.MaxAttempts > 0 && n >= c.policy.MaxAttempts) || time.Now().Add(wait).After(deadline) {
			return &RetryError{Key: key, MayHaveTakenEffect: maybe, Attempts: n, Last: last}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &RetryError{Key: key, MayHaveTakenEffect: maybe, Attempts: n, Last: ctx.Err()}
		case <-t.C:
		}
	}
}

// backoff is the full-jitter wait after attempt n.
func (c *Client) backoff(n int) time.Duration {
	ceiling := c.policy.MaxDelay
	if shift := n - 1; shift < 30 {
		ceiling = min(ceiling, c.policy.BaseDelay<<shift)
	}
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling) + 1
}

// parseRetryAfter reads Retry-After's delay-seconds form; the API sends no
// other.
func parseRetryAfter(h string) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(h))
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// maxErrorBody bounds what is read of an answer that is not a problem
// document, for the error message.
const maxErrorBody = 4 << 10

// decode reads resp: a 2xx into out, anything else into an *Error.
func decode(resp *http.Response, out any) error {
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return fmt.Errorf("payments API: decode %d response: %w", resp.StatusCode, err)
		}
		return nil
	}
	e := &Error{StatusCode: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err := json.Unmarshal(body, &e.Problem); err != nil || e.Type == "" {
		// Not the API's problem document: a proxy's error page, say.
		e.Problem = Problem{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode), Detail: strings.TrimSpace(string(body))}
	}
	return e
}
