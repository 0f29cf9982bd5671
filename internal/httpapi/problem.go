package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/events"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/refunds"
	"github.com/payments-reference/idempotent-payments/internal/validation"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// ProblemTypeBase prefixes every problem type URI. Each type is documented in
// docs/problems.md and openapi.yaml; forks should point it at their own docs.
const ProblemTypeBase = "https://payments-reference.dev/problems/"

// ContentTypeProblem is RFC 9457's media type for problem details.
const ContentTypeProblem = "application/problem+json"

// Problem is an RFC 9457 problem details object. Clients branch on Type,
// never on Title or Detail.
type Problem struct {
	Type      string                  `json:"type"`
	Title     string                  `json:"title"`
	Status    int                     `json:"status"`
	Detail    string                  `json:"detail"`
	Instance  string                  `json:"instance,omitempty"`
	RequestID string                  `json:"request_id"`
	Errors    []validation.FieldError `json:"errors,omitempty"`

	retryAfter int // seconds; sent as Retry-After when > 0
}

// problemType is one kind of problem; the slug is the stable part of its URI.
type problemType struct {
	slug   string
	title  string
	status int
}

// Every problem the API can answer with.
var (
	ptValidation       = problemType{"validation-failed", "The request is not valid", http.StatusBadRequest}
	ptInvalidJSON      = problemType{"invalid-json", "The request body is not valid JSON", http.StatusBadRequest}
	ptKeyMissing       = problemType{"idempotency-key-missing", "Idempotency-Key header is required", http.StatusBadRequest}
	ptKeyInvalid       = problemType{"idempotency-key-invalid", "Idempotency-Key header is malformed", http.StatusBadRequest}
	ptUnauthenticated  = problemType{"unauthenticated", "Authentication required", http.StatusUnauthorized}
	ptForbidden        = problemType{"forbidden", "The API key lacks the required scope", http.StatusForbidden}
	ptNotFound         = problemType{"not-found", "Not found", http.StatusNotFound}
	ptMethodNotAllowed = problemType{"method-not-allowed", "Method not allowed", http.StatusMethodNotAllowed}
	ptInProgress       = problemType{"idempotency-request-in-progress", "A request with this Idempotency-Key is in progress", http.StatusConflict}
	ptRequestTimeout   = problemType{"request-timeout", "The request body did not arrive in time", http.StatusRequestTimeout}
	ptTooLarge         = problemType{"payload-too-large", "The request body is too large", http.StatusRequestEntityTooLarge}
	ptMediaType        = problemType{"unsupported-media-type", "The request body must be application/json", http.StatusUnsupportedMediaType}
	ptKeyReused        = problemType{"idempotency-key-reused", "Idempotency-Key was used for a different request", http.StatusUnprocessableEntity}
	ptRefundExceeds    = problemType{"refund-exceeds-payment", "The refund exceeds what remains of the payment", http.StatusUnprocessableEntity}
	ptNotRefundable    = problemType{"payment-not-refundable", "The payment cannot be refunded", http.StatusUnprocessableEntity}
	ptProcessing       = problemType{"payment-processing", "The payment is still being charged", http.StatusConflict}
	ptTooManyEndpoints = problemType{"too-many-webhook-endpoints", "Too many webhook endpoints", http.StatusUnprocessableEntity}
	ptEndpointDisabled = problemType{"webhook-endpoint-disabled", "The webhook endpoint is disabled", http.StatusConflict}
	ptTooManyEvents    = problemType{"too-many-events-to-recover", "Too many events to recover at once", http.StatusUnprocessableEntity}
	ptRateLimited      = problemType{"rate-limited", "Too many requests", http.StatusTooManyRequests}
	ptQuotaExceeded    = problemType{"idempotency-key-quota-exceeded", "Too many live idempotency keys", http.StatusTooManyRequests}
	ptInternal         = problemType{"internal-error", "Internal server error", http.StatusInternalServerError}
	ptUnavailable      = problemType{"service-unavailable", "The service is temporarily unavailable", http.StatusServiceUnavailable}
	ptOutcomeUnknown   = problemType{"outcome-unknown", "The outcome of the request is unknown", http.StatusServiceUnavailable}
)

// Errors raised by this package's own request parsing.
var (
	errUnsupportedMediaType = errors.New("content type must be application/json")
	errPayloadTooLarge      = errors.New("request body too large")
	errBodyTimeout          = errors.New("request body did not arrive before the read deadline")
	errNotFound             = errors.New("no such resource")
	errMethodNotAllowed     = errors.New("method not allowed for this resource")
)

// problemFor is the one place where errors become HTTP responses.
func problemFor(err error) Problem {
	var ve *validation.Error
	var missing *auth.MissingScopeError
	switch {
	case errors.As(err, &ve):
		return newProblem(ptValidation, "One or more fields are invalid.").withErrors(ve.Fields)
	case errors.Is(err, idempotency.ErrBodyNotJSON):
		return newProblem(ptInvalidJSON, "The body must be exactly one JSON value.")
	case errors.Is(err, idempotency.ErrKeyMissing):
		return newProblem(ptKeyMissing, "Send a unique Idempotency-Key header (1-255 printable ASCII characters) with every POST.")
	case errors.Is(err, idempotency.ErrKeyInvalid):
		return newProblem(ptKeyInvalid, "Idempotency-Key must be 1-255 printable ASCII characters.")
	case errors.Is(err, auth.ErrUnauthenticated):
		return newProblem(ptUnauthenticated, "Send a valid, unrevoked API key as 'Authorization: Bearer <secret>'.")
	case errors.As(err, &missing):
		return newProblem(ptForbidden, fmt.Sprintf("The API key lacks the scope %q, which this operation requires. Create a key with it: api keys create --scopes %s.", missing.Scope, missing.Scope))
	case errors.Is(err, auth.ErrForbidden):
		return newProblem(ptForbidden, "The API key does not have the scope this operation requires.")
	case errors.Is(err, payments.ErrNotFound), errors.Is(err, refunds.ErrNotFound), errors.Is(err, errNotFound),
		errors.Is(err, events.ErrNotFound), errors.Is(err, webhooks.ErrNotFound):
		return newProblem(ptNotFound, "No such resource.")
	case errors.Is(err, errMethodNotAllowed):
		return newProblem(ptMethodNotAllowed, "This resource does not support that method.")
	case errors.Is(err, idempotency.ErrRequestInProgress):
		return newProblem(ptInProgress, "Another request with this Idempotency-Key has not finished. Retry after the indicated delay to get its result.").retry(1)
	case errors.Is(err, errBodyTimeout):
		return newProblem(ptRequestTimeout, "The request body did not arrive completely before the server's read deadline. Nothing was executed; send it again with the same Idempotency-Key.")
	case errors.Is(err, errPayloadTooLarge):
		return newProblem(ptTooLarge, "The request body exceeds the size limit.")
	case errors.Is(err, errUnsupportedMediaType):
		return newProblem(ptMediaType, "Send the body as application/json.")
	case errors.Is(err, idempotency.ErrKeyReused):
		return newProblem(ptKeyReused, "This Idempotency-Key was already used with a different request body or path. Nothing was executed; use a new key for a new request.")
	case errors.Is(err, webhooks.ErrDisabled):
		return newProblem(ptEndpointDisabled, "Nothing is sent to a disabled endpoint. Nothing was queued; enable it (PATCH with {\"status\": \"enabled\"}), then retry with the same Idempotency-Key.")
	case errors.Is(err, webhooks.ErrTooManyEvents):
		return newProblem(ptTooManyEvents, fmt.Sprintf("The window holds more than %d events this endpoint takes. Nothing was queued; recover it in parts (set until), each with its own Idempotency-Key.", webhooks.MaxRecoverEvents))
	case errors.Is(err, refunds.ErrPaymentProcessing):
		return newProblem(ptProcessing, "The payment's charge is not decided yet (it is processing, or waiting for reconciliation with the processor). Nothing was recorded; retry after the indicated delay with the same Idempotency-Key.").retry(1)
	case errors.Is(err, errRateLimited):
		return newProblem(ptRateLimited, "This caller has sent more requests this second than its rate limit allows (see the RateLimit-Policy header). Nothing was executed; retry after the indicated delay with the same Idempotency-Key.").retry(1)
	case errors.Is(err, idempotency.ErrQuotaExceeded):
		return newProblem(ptQuotaExceeded, "This principal holds as many live idempotency keys as its quota allows. Existing keys can still be replayed; new ones are accepted again as old ones expire.").retry(60)
	// Before ErrUnavailable and DeadlineExceeded, which an unknown outcome
	// may wrap too: "no effect" would be a lie after COMMIT was sent.
	case errors.Is(err, database.ErrOutcomeUnknown):
		return newProblem(ptOutcomeUnknown, "The connection to the database was lost, or the request ran out of time, while it was committing, so it may or may not have taken effect. Retry with the same Idempotency-Key to learn the outcome; never retry with a new key.").retry(1)
	case errors.Is(err, database.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return newProblem(ptUnavailable, "The request had no effect. Retry after the indicated delay with the same Idempotency-Key.").retry(1)
	default:
		return newProblem(ptInternal, "The request had no effect. Retry with the same Idempotency-Key.")
	}
}

func newProblem(t problemType, detail string) Problem {
	return Problem{Type: ProblemTypeBase + t.slug, Title: t.title, Status: t.status, Detail: detail}
}

func (p Problem) withErrors(fe []validation.FieldError) Problem { p.Errors = fe; return p }

func (p Problem) retry(seconds int) Problem { p.retryAfter = seconds; return p }

// forRead words a server-side problem for a request that changes nothing
// (GET, HEAD, /readyz): there is no key to reuse, and nothing to have had an
// effect.
func (p Problem) forRead() Problem {
	switch p.Type {
	case ProblemTypeBase + ptUnavailable.slug:
		p.Detail = "The service cannot reach its database right now. Retry after the indicated delay."
	case ProblemTypeBase + ptInternal.slug:
		p.Detail = "The request failed. Retry it."
	}
	return p
}

// render completes p for request r and encodes it.
func (p Problem) render(r *http.Request) []byte {
	p.Instance = r.URL.Path
	p.RequestID = requestIDFrom(r.Context())
	b, err := json.Marshal(p)
	if err != nil {
		// Problem holds only strings and ints; Marshal cannot fail on it.
		panic(err)
	}
	return b
}

// writeError answers r with the problem err maps to, logging server errors.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	if errors.Is(err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled) {
		// The client went away: nobody will read an answer, and it is no
		// server fault. (Whatever was committed stays, as for any request.)
		log.InfoContext(r.Context(), "client went away before the answer", "error", err)
		return
	}
	p := problemFor(err)
	if r.Method != http.MethodPost {
		p = p.forRead()
	}
	if p.Status >= 500 {
		log.ErrorContext(r.Context(), "request failed", "error", err, "status", p.Status)
	}
	writeProblem(w, r, p)
}

func writeProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
	}
	if p.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	w.Header().Set("Content-Type", ContentTypeProblem)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.render(r))
}
