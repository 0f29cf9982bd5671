package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A run's webhooks (-webhook-latency): every principal registers one
// endpoint, at a receiver on loopback that answers 200 after the latency,
// so that every charge's event is delivered while the run goes on, in the
// webhook workers' own queue, beside the charges. The figures come from
// river_job, as the charges' do (outbox.go).

// deliveryKind is the webhook deliveries' kind in river_job
// (webhooks.DeliveryArgs), written out so that the load test builds in a
// fork without webhooks (docs/fork.md); TestDeliveryKind holds it to the
// service's.
const deliveryKind = "deliver_webhook"

// slowReceiver answers every delivery 200 after a fixed latency.
type slowReceiver struct {
	srv *http.Server
	url string
}

// startReceiver listens on a free loopback port.
func startReceiver(latency time.Duration) (*slowReceiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &slowReceiver{url: "http://" + l.Addr().String() + "/webhooks"}
	rc.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(latency):
		case <-r.Context().Done():
		}
	})}
	go func() { _ = rc.srv.Serve(l) }()
	return rc, nil
}

func (rc *slowReceiver) close() { _ = rc.srv.Close() }

// registerEndpoints registers the receiver's URL as each client's endpoint,
// through the API, as a client would.
func registerEndpoints(ctx context.Context, apiURL, receiverURL string, clients []client) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	for _, c := range clients {
		key := make([]byte, 8)
		_, _ = rand.Read(key)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/webhook_endpoints",
			strings.NewReader(`{"url": "`+receiverURL+`", "enabled_events": ["payment.succeeded", "payment.failed"]}`))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.secret)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "loadtest-endpoint-"+hex.EncodeToString(key))
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("register a webhook endpoint: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("register a webhook endpoint: %s (the API must allow loopback endpoints: WEBHOOK_ALLOW_PRIVATE_URLS)", resp.Status)
		}
	}
	return nil
}

// deliveryFigures fills st's webhook figures for the deliveries of the
// charges decided in the measured run [from, to), read after the drain.
func deliveryFigures(ctx context.Context, admin *pgxpool.Pool, st *Stage, from, to time.Time) error {
	err := admin.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE finalized_at IS NULL),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at)), 0)::float8,
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at)), 0)::float8
		FROM river_job
		WHERE kind = $3 AND created_at >= $1 AND created_at < $2`, from, to, deliveryKind).
		Scan(&st.Deliveries, &st.DeliveriesLeft, &st.DeliveryLagP50, &st.DeliveryLagP99)
	if err != nil {
		return fmt.Errorf("delivery figures: %w", err)
	}
	return nil
}
