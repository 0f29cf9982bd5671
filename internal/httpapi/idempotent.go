package httpapi

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// idempotentRequest checks the Idempotency-Key header and describes the
// request for the executor. canonicalBody comes from decodeJSON.
//
// The scope's endpoint is the route template ("POST /v1/payments/{id}/refunds"),
// so one key sent to two operations is two records; the fingerprint covers
// the concrete path, so one key reused for a different payment's refund is a
// mismatch, not a replay.
func idempotentRequest(r *http.Request, canonicalBody []byte) (idempotency.Request, error) {
	key := r.Header.Get("Idempotency-Key")
	if err := idempotency.ValidateKey(key); err != nil {
		return idempotency.Request{}, err
	}
	p, ok := auth.FromContext(r.Context())
	if !ok {
		return idempotency.Request{}, auth.ErrUnauthenticated
	}
	return idempotency.Request{
		Scope: idempotency.Scope{
			Principal: p.ID,
			Endpoint:  r.Method + " " + chi.RouteContext(r.Context()).RoutePattern(),
			Key:       key,
		},
		Fingerprint: idempotency.Fingerprint(r.Method, r.URL.Path, canonicalBody),
		RequestID:   requestIDFrom(r.Context()),
	}, nil
}

// validatable is a request body that can check its own fields.
type validatable interface{ Validate() error }

// parseIdempotent reads a protected POST in the one order every endpoint
// uses: body (413, 415, invalid JSON), Idempotency-Key, then field
// validation. All of it happens before the claim, so a rejected request
// consumes no key and stores nothing.
func (a *api) parseIdempotent(w http.ResponseWriter, r *http.Request, in validatable) (idempotency.Request, error) {
	canonical, err := decodeJSON(w, r, a.maxBodyBytes, in)
	if err != nil {
		return idempotency.Request{}, err
	}
	req, err := idempotentRequest(r, canonical)
	if err != nil {
		return idempotency.Request{}, err
	}
	if err := in.Validate(); err != nil {
		return idempotency.Request{}, err
	}
	return req, nil
}

// runIdempotent executes op under the request's key, or replays, and writes
// the result. Only status, content type and body are stored and replayed;
// a replay adds Idempotent-Replayed and X-Original-Request-Id.
func (a *api) runIdempotent(w http.ResponseWriter, r *http.Request, req idempotency.Request, op idempotency.Operation) {
	res, err := a.idem.Do(r.Context(), req, op)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("X-Original-Request-Id", res.OriginalRequestID)
	}
	if a.serverTiming {
		w.Header().Set("Server-Timing", fmt.Sprintf("claim;dur=%.3f", float64(res.ClaimDuration.Microseconds())/1000))
	}
	writeResponse(w, res.Response)
}
