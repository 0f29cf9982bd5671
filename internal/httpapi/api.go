// Package httpapi is the HTTP face of the service: routing, authentication,
// request parsing, and the one mapping from errors to RFC 9457 problems.
// Handlers are thin: they parse, validate, and hand the write to the
// idempotency executor.
package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// Deps is everything the API needs.
type Deps struct {
	Logger *slog.Logger
	// Pool connects as the service role.
	Pool *database.Pool
	// Idempotency runs each protected write under its key: the service's
	// *idempotency.Executor. An interface so that the load test can measure
	// the same handlers with the store taken out, or replaced by its peer.
	Idempotency Executor
	// Outbox takes the jobs a request inserts in its transaction: the
	// processor calls of payments and refunds.
	Outbox outbox.Enqueuer
	// Keyring derives webhook endpoints' signing secrets; URLs decides
	// which URLs an endpoint may have.
	Keyring webhooks.Keyring
	URLs    webhooks.URLPolicy
	// Webhooks queues the deliveries a client asks for again (a resend, a
	// recover) on the workers' schedule.
	Webhooks webhooks.Fanout
	// Livemode marks the payments this service creates: true only when the
	// processor moves real money, false with the simulator (test mode).
	Livemode bool
	// MaxBodyBytes bounds request bodies (413 above it).
	MaxBodyBytes int64
	// RequestTimeout bounds each request's work.
	RequestTimeout time.Duration
	// RateLimits bound each caller's requests a second; zero values, none.
	RateLimits RateLimits
	// TracerProvider, MeterProvider and Propagator instrument every request
	// (server spans and otelhttp's metrics); nil means no telemetry.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
}

// Executor runs an idempotency.Operation under its request's key, or replays.
type Executor interface {
	Do(ctx context.Context, req idempotency.Request, op idempotency.Operation) (idempotency.Result, error)
}

type api struct {
	log          *slog.Logger
	pool         *database.Pool
	idem         Executor
	outbox       outbox.Enqueuer
	maxBodyBytes int64
	livemode     bool
	keyring      webhooks.Keyring
	urls         webhooks.URLPolicy
	webhooks     webhooks.Fanout
}

// knownKeys is how many API keys' principals the service remembers
// (auth.KeyPrincipals): about 100 bytes each.
const knownKeys = 100_000

// New returns the API's handler.
func New(d Deps) http.Handler {
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &api{log: slog.New(withRequestIDs(log.Handler())), pool: d.Pool, idem: d.Idempotency, outbox: d.Outbox, maxBodyBytes: d.MaxBodyBytes, livemode: d.Livemode,
		keyring: d.Keyring, urls: d.URLs, webhooks: d.Webhooks}

	r := chi.NewRouter()
	r.Use(requestID, traced(d.TracerProvider, d.MeterProvider, d.Propagator), accessLog(a.log), recoverer(a.log), timeout(d.RequestTimeout), headAsGet)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) { writeError(w, r, a.log, errNotFound) })
	var routes chi.Routes // set below, once every route is mounted
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allowed(routes, r.URL.Path))
		writeError(w, r, a.log, errMethodNotAllowed)
	})

	r.Get("/healthz", a.healthz)
	r.Get("/readyz", a.readyz)
	mountDocs(r)
	r.Route("/v1", func(r chi.Router) {
		r.Use(authenticate(a.log, auth.NewKeyPrincipals(knownKeys), newLimiter(d.RateLimits)))
		r.Mount("/payments", a.paymentRoutes())
		r.Mount("/refunds", a.refundRoutes())
		r.Mount("/events", a.eventRoutes())
		r.Mount("/webhook_endpoints", a.webhookRoutes())
	})
	routes = flatten(r)
	return r
}

// flatten copies a router's routes, every mounted router's included, into
// one router without mounts, whose Match answers "is method served at
// path?" exactly: chi's Match on a router with mounts also matches the
// mounts' catch-all stubs, for any method.
func flatten(router chi.Routes) chi.Routes {
	flat := chi.NewRouter()
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	// Walk fails only when its callback does, and this one never does.
	_ = chi.Walk(router, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		route = strings.ReplaceAll(route, "/*", "")
		flat.Method(method, route, noop)
		if trimmed := strings.TrimSuffix(route, "/"); trimmed != "" && trimmed != route {
			flat.Method(method, trimmed, noop)
		}
		return nil
	})
	return flat
}

// allowed lists the methods served at path, for a 405's Allow header (RFC
// 9110 requires one; chi gives a custom 405 handler no access to its list).
// HEAD comes with every GET (headAsGet).
func allowed(routes chi.Routes, path string) string {
	var methods []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if routes.Match(chi.NewRouteContext(), m, path) || (m == http.MethodHead && slices.Contains(methods, http.MethodGet)) {
			methods = append(methods, m)
		}
	}
	return strings.Join(methods, ", ")
}

// healthz answers as long as the process serves HTTP; it needs nothing else,
// so an orchestrator does not restart the service because PostgreSQL is down.
func (a *api) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ok"}`))
}

// readyz answers 200 only when the database answers within a second, so a
// load balancer stops sending traffic that could only get 503s.
func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := a.pool.Ping(ctx); err != nil {
		a.log.WarnContext(r.Context(), "readiness check failed", "error", err)
		writeError(w, r, a.log, database.ErrUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ready"}`))
}
