package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// stripeLedger stands in for Stripe's API with what a charge and a refund
// return: enough for serve's wiring of PROCESSOR=stripe, end to end. What
// Stripe accepts is proven against stripe-mock in internal/processor/stripe.
type stripeLedger struct {
	mu    sync.Mutex
	calls []url.Values // each call's form, with "path" and "key" added
}

func (s *stripeLedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	call := r.Form
	call.Set("path", r.URL.Path)
	call.Set("key", r.Header.Get("Idempotency-Key"))
	call.Set("auth", r.Header.Get("Authorization"))
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/payment_intents":
		_, _ = io.WriteString(w, `{"id": "pi_e2e", "object": "payment_intent", "status": "succeeded", "livemode": false}`)
	case "/v1/refunds":
		_, _ = io.WriteString(w, `{"id": "re_e2e", "object": "refund", "status": "succeeded"}`)
	default:
		http.NotFound(w, r)
	}
}

func (s *stripeLedger) call(path string) url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.calls {
		if c.Get("path") == path {
			return c
		}
	}
	return nil
}

// TestServeChargesStripe runs serve with PROCESSOR=stripe: a payment is a
// PaymentIntent keyed by the client's intent, its refund names that
// PaymentIntent by the id Stripe gave (kept on the refund's row), and a test
// key says livemode false.
func TestServeChargesStripe(t *testing.T) {
	t.Parallel()
	ledger := &stripeLedger{}
	stripeAPI := httptest.NewServer(ledger)
	t.Cleanup(stripeAPI.Close)
	db := testdb.New(t, 11)
	addr := freeAddr(t)
	getenv := env(map[string]string{
		"ADDR": addr, "METRICS_ADDR": "off", "DB_MAX_CONNS": "4", "OUTBOX_DB_MAX_CONNS": "2",
		"DATABASE_URL": db.AppURL, "MIGRATE_DATABASE_URL": db.OwnerURL, "MAINTENANCE_DATABASE_URL": db.MaintenanceURL,
		"PROCESSOR": "stripe", "STRIPE_SECRET_KEY": "sk_test_e2e", "STRIPE_API_URL": stripeAPI.URL, "RECONCILE_GRACE": "5m",
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs syncBuffer
	go func() { done <- runLogging(ctx, nil, getenv, io.Discard, &logs) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitOK(t, "http://"+addr+"/readyz")
	require.Contains(t, logs.String(), `"msg":"TEST MODE: STRIPE_SECRET_KEY is a test key`)
	require.NotContains(t, logs.String(), "sk_test_e2e", "the secret key is never logged")

	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:write,payments:read,refunds:write,refunds:read"}, getenv, &out))
	var key struct{ Secret string }
	require.NoError(t, json.Unmarshal(out.Bytes(), &key))
	send := func(method, path, idemKey, body string) map[string]any {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		if idemKey != "" {
			req.Header.Set("Idempotency-Key", idemKey)
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var v map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		require.Less(t, resp.StatusCode, 300, "%s %s: %v", method, path, v)
		return v
	}
	settled := func(path, status string) map[string]any {
		t.Helper()
		var v map[string]any
		require.Eventually(t, func() bool {
			v = send(http.MethodGet, path, "", "")
			return v["status"] == status
		}, 30*time.Second, 50*time.Millisecond, "%s never became %s", path, status)
		return v
	}

	p := send(http.MethodPost, "/v1/payments", "order-1", `{"amount": 1999, "currency": "eur"}`)
	require.Equal(t, false, p["livemode"], "a test key moves no money")
	id := p["id"].(string)
	settled("/v1/payments/"+id, "succeeded")
	charge := ledger.call("/v1/payment_intents")
	require.Equal(t, "Bearer sk_test_e2e", charge.Get("auth"))
	require.Equal(t, "1999", charge.Get("amount"))
	require.Equal(t, "eur", charge.Get("currency"))
	require.Equal(t, charge.Get("key"), charge.Get("metadata[processor_key]"))
	require.NotContains(t, charge.Get("key"), id, "the charge is keyed by the client's intent, not the payment's id")

	r := send(http.MethodPost, "/v1/payments/"+id+"/refunds", "refund-1", `{"amount": 500}`)
	settled("/v1/refunds/"+r["id"].(string), "succeeded")
	refund := ledger.call("/v1/refunds")
	require.Equal(t, "pi_e2e", refund.Get("payment_intent"), "the refund names the charge by Stripe's id")
	require.Equal(t, "500", refund.Get("amount"))
	require.NotEqual(t, charge.Get("key"), refund.Get("key"))
}
