package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// idempotentRequest checks the Idempotency-Key header and describes the
// request for the executor. canonicalBody comes from decodeJSON.
//
// The scope's endpoint is the route template ("POST /v1/payments/{id}/refunds"),
// so one key sent to two operations is two records; the fingerprint covers
// the request as the route understands it (canonicalTarget), so one key
// reused for a different payment's refund is a mismatch, not a replay, while
// every spelling the router accepts for one request is that one request.
func idempotentRequest(r *http.Request, canonicalBody []byte) (idempotency.Request, error) {
	// The header is one sf-string (the draft): sent twice, which of the two
	// the client meant is not for the server to pick.
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		return idempotency.Request{}, fmt.Errorf("%w: the header is sent more than once", idempotency.ErrKeyInvalid)
	}
	key, err := idempotency.ParseKey(r.Header.Get("Idempotency-Key"))
	if err != nil {
		return idempotency.Request{}, err
	}
	creds, scope, err := caller(r)
	if err != nil {
		return idempotency.Request{}, err
	}
	principal, _ := creds.Principal()
	return idempotency.Request{
		Principal: principal,
		Authenticate: func() (database.Statement, *uuid.UUID) {
			var p auth.Principal
			return creds.Authentication(scope, &p), &p.ID
		},
		Scope: idempotency.Scope{
			Endpoint: r.Method + " " + chi.RouteContext(r.Context()).RoutePattern(),
			Key:      key,
		},
		Fingerprint: idempotency.Fingerprint(r.Method, canonicalTarget(r), canonicalBody),
		RequestID:   requestIDFrom(r.Context()),
	}, nil
}

// canonicalTarget is the path as the route understands it: the route
// template without a trailing slash, its parameters filled in with their
// canonical form (a UUID in lower case with hyphens, as the handler parses
// it). /v1/payments and /v1/payments/, or a payment id in upper case, are
// spellings of one request, so they must fingerprint alike: otherwise a retry
// that spells it differently gets 422 "use a new key", and following that
// advice would pay twice. For a request spelled canonically this is its path,
// so fingerprints stored before it was introduced still match.
func canonicalTarget(r *http.Request) string {
	rc := chi.RouteContext(r.Context())
	target := rc.RoutePattern()
	if len(target) > 1 {
		target = strings.TrimSuffix(target, "/")
	}
	for i, name := range rc.URLParams.Keys {
		if name == "*" {
			continue
		}
		v := rc.URLParams.Values[i]
		if id, err := uuid.Parse(v); err == nil {
			v = id.String()
		}
		target = strings.Replace(target, "{"+name+"}", v, 1)
	}
	return target
}

// validatable is a request body that can check its own fields.
type validatable interface{ Validate() error }

// parseIdempotent reads a protected POST in the one order every endpoint
// uses: body (413, 415, invalid JSON), Idempotency-Key, then field
// validation. All of it happens before the claim, so a rejected request
// consumes no key and stores nothing.
func (a *api) parseIdempotent(w http.ResponseWriter, r *http.Request, in validatable) (idempotency.Request, error) {
	req, err := parseIdempotent(w, r, a.maxBodyBytes, in)
	if err != nil {
		return idempotency.Request{}, a.refuse(r, err)
	}
	return req, nil
}

// refuse returns what to answer a request rejected, before its claim, with
// err: a caller who may not make this request at all hears that first (401,
// 403), not what is wrong with the request. Only a rejected request pays
// this round trip: an accepted one is authenticated in its transaction's
// first.
func (a *api) refuse(r *http.Request, err error) error {
	authErr := a.read(r, func(context.Context, pgx.Tx, uuid.UUID) error { return nil })
	if errors.Is(authErr, auth.ErrUnauthenticated) || errors.Is(authErr, auth.ErrForbidden) {
		return authErr
	}
	return err
}

func parseIdempotent(w http.ResponseWriter, r *http.Request, maxBodyBytes int64, in validatable) (idempotency.Request, error) {
	canonical, err := decodeJSON(w, r, maxBodyBytes, in)
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
	writeResponse(w, res.Response)
}
