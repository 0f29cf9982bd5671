package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// This file is the receiver's half of webhooks: verifying a delivery and
// handing its event to the application, which must apply each event once.
// The service delivers at least once (a receiver's 2xx can be lost, a
// delivery repeated after a crash), so a receiver deduplicates by the
// event's id, the webhook-id header: the same pattern the service applies
// to its own requests, on the other side. docs/webhooks.md, and the
// example receiver in examples/webhook-receiver, show it end to end.

// MaxWebhookBytes bounds a delivery's body: an event is a few kilobytes.
const MaxWebhookBytes = 1 << 20

// ErrWebhookNotAuthentic means no secret signed the delivery, or its
// timestamp is more than five minutes from this clock (a replayed capture).
var ErrWebhookNotAuthentic = errors.New("webhook: not signed by this endpoint's secret, or too old")

// VerifyWebhook checks a delivery's Standard Webhooks headers against its
// body: it is authentic when one of secrets (both during a rotation) made
// one of its signatures, and its webhook-timestamp is within five minutes of
// now. It uses the specification's own library.
func VerifyWebhook(header http.Header, body []byte, secrets ...string) error {
	var errs []error
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return fmt.Errorf("webhook secret: %w", err)
		}
		err = wh.Verify(body, header)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%w: %w", ErrWebhookNotAuthentic, errors.Join(errs...))
}

// WebhookHandler returns the handler of a webhook endpoint. It verifies each
// delivery (VerifyWebhook, with any of secrets), decodes its event, and
// calls apply, answering 200 once apply returns nil; 400 to a delivery that
// is not authentic or not an event; 500 when apply fails (the service
// retries later, on its schedule).
//
// apply must apply each event once: record its id (Event.Id, the
// webhook-id) in the same transaction as the event's effect, and return nil
// without doing anything when the id is already recorded. A repeated
// delivery then changes nothing, whether it comes a second later or after
// a crash.
func WebhookHandler(apply func(ctx context.Context, e Event) error, secrets ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxWebhookBytes))
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		if err := VerifyWebhook(r.Header, body, secrets...); err != nil {
			http.Error(w, "not authentic", http.StatusBadRequest)
			return
		}
		var e Event
		if err := json.Unmarshal(body, &e); err != nil || e.Id.String() != r.Header.Get("webhook-id") {
			http.Error(w, "not an event", http.StatusBadRequest)
			return
		}
		if err := apply(r.Context(), e); err != nil {
			http.Error(w, "not applied; send it again", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
