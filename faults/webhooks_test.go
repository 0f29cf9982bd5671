package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	paymentsclient "github.com/payments-reference/idempotent-payments/client"
	"github.com/payments-reference/idempotent-payments/examples/webhook-receiver/receiver"
	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
)

// Killed (kill -9) while its deliveries were at the receiver, which had
// applied each event and not yet answered: after a restart the rescued jobs
// deliver again, and the receiver, which applies each webhook-id once, ends
// with exactly one effect per event. No event is lost for a committed
// change, and none exists without one.
func TestCrashDuringAWebhookDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: runs and kills the service binary; the full test command (and CI) runs it")
	}
	t.Parallel()
	r := newRig(t, simulator.Config{}, "WEBHOOK_RETRY_SCHEDULE=0s,200ms,200ms,200ms,200ms,200ms,200ms,200ms", "WEBHOOK_TIMEOUT=4s")
	ctx := context.Background()
	_, err := r.admin.Exec(ctx, receiver.Schema)
	require.NoError(t, err)

	// The receiver applies each event, then holds its answer until the
	// test lets it go: the service dies with every delivery in flight.
	hold := make(chan struct{})
	var mu sync.Mutex
	var secret string
	var deliveries int
	rcv := &receiver.Receiver{Pool: r.admin}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		deliveries++
		s := secret
		mu.Unlock()
		rec := httptest.NewRecorder()
		paymentsclient.WebhookHandler(rcv.Apply, s).ServeHTTP(rec, req)
		select {
		case <-hold:
		case <-req.Context().Done():
			return
		}
		w.WriteHeader(rec.Code)
	}))
	t.Cleanup(srv.Close)

	var key auth.NewKey
	require.NoError(t, pgx.BeginFunc(ctx, r.admin, func(tx pgx.Tx) (err error) {
		key, err = auth.CreateKey(ctx, tx, "outbox", []string{auth.ScopeWebhooksWrite})
		return err
	}))
	req, err := http.NewRequest(http.MethodPost, r.api.URL()+"/v1/webhook_endpoints", strings.NewReader(`{"url": "`+srv.URL+`"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key.Secret)
	req.Header.Set("Idempotency-Key", "endpoint")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	var ep struct{ Secret string }
	require.NoError(t, json.Unmarshal(body, &ep))
	mu.Lock()
	secret = ep.Secret
	mu.Unlock()

	ids := r.pay(6, 3)
	count := func(sql string) int {
		var n int
		require.NoError(t, r.admin.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return count(`SELECT count(*) FROM effects`) == len(ids) }, 30*time.Second, 20*time.Millisecond,
		"the receiver never applied every event")
	r.api.kill9()
	close(hold)
	require.Zero(t, count(`SELECT count(*) FROM webhook_deliveries WHERE status_code = 200`),
		"a delivery was recorded before the crash: the test did not crash in between")

	require.NoError(t, r.api.start(ctx))
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM river_job WHERE kind = 'deliver_webhook' AND state = 'completed'`) == len(ids)
	}, time.Minute, 50*time.Millisecond, "the deliveries never completed after the restart")
	mu.Lock()
	require.Greater(t, deliveries, len(ids), "every event was delivered again after the crash")
	mu.Unlock()
	require.Equal(t, len(ids), count(`SELECT count(*) FROM effects`), "exactly one effect per event")
	require.Equal(t, len(ids), count(`SELECT count(DISTINCT webhook_id) FROM effects`))
	s, err := read(ctx, r.admin)
	require.NoError(t, err)
	missing, stray := eventChecks(s)
	require.Zero(t, missing, "decided payments without their event")
	require.Zero(t, stray, "events without their change")
}
