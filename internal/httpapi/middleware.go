package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/payments-reference/idempotent-payments/internal/auth"
)

type requestIDKey struct{}

// requestIDFrom returns the request's id, or "" outside a request.
func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// requestID gives every request a server-generated id, sent as X-Request-Id.
// An id sent by the client is ignored: the id is stored as the correlation id
// of the attempt that produced a response, so it must be unique and ours.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // crypto/rand.Read never fails
		id := "req_" + hex.EncodeToString(b)
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// statusRecorder remembers what was written, for the access log.
type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += n
	return n, err
}

// accessLog writes one line per request. It logs the route template and the
// request id, never headers, bodies or idempotency keys: those may carry
// secrets or personal data.
func accessLog(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			rec := &statusRecorder{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			route := ""
			if rc := chi.RouteContext(r.Context()); rc != nil {
				route = rc.RoutePattern()
			}
			// request_id and trace_id come from the logger (withRequestIDs).
			log.InfoContext(r.Context(), "request",
				"method", r.Method,
				"route", route,
				"status", rec.status,
				"bytes", rec.bytes,
				"duration_ms", float64(time.Since(start).Microseconds())/1000,
				"replayed", rec.Header().Get("Idempotent-Replayed") == "true",
			)
		})
	}
}

// traced starts a server span for every request (honouring an incoming
// traceparent) and records otelhttp's HTTP metrics. The span is named by the
// route template, "POST /v1/payments/{id}/refunds", never the concrete path:
// chi knows the template only after routing, so the name is set inside the
// router, once the handler has returned. The span carries the request id,
// so X-Request-Id finds the trace.
func traced(tp trace.TracerProvider, mp metric.MeterProvider, prop propagation.TextMapPropagator) func(http.Handler) http.Handler {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	otel := otelhttp.NewMiddleware("http.server",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithMeterProvider(mp),
		otelhttp.WithPropagators(prop),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
	)
	name := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			span := trace.SpanFromContext(r.Context())
			span.SetAttributes(attribute.String("http.request.id", requestIDFrom(r.Context())))
			next.ServeHTTP(w, r)
			if rc := chi.RouteContext(r.Context()); rc != nil {
				if pattern := rc.RoutePattern(); pattern != "" {
					span.SetName(r.Method + " " + pattern)
					span.SetAttributes(semconv.HTTPRoute(pattern))
					// otelhttp adds the labeler's attributes to its metrics,
					// which it records after this returns.
					if l, ok := otelhttp.LabelerFromContext(r.Context()); ok {
						l.Add(semconv.HTTPRoute(pattern))
					}
				}
			}
		})
	}
	return func(next http.Handler) http.Handler { return otel(name(next)) }
}

// traceID returns the current trace id for logs, or "".
func traceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}

// recoverer turns a panic into a 500 problem. The panic has already unwound
// through the request's transaction, whose deferred rollback undid the claim.
func recoverer(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.ErrorContext(r.Context(), "panic", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				writeProblem(w, r, newProblem(ptInternal, "The request had no effect. Retry with the same Idempotency-Key."))
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// headAsGet answers HEAD on every GET route exactly as GET, without the
// body (RFC 9110, 9.3.2): the request is routed as a GET, and what the
// handler writes is dropped. It runs last, so the access log and the span
// still say HEAD. (chi's middleware.GetHead looks the route up ahead of
// routing and missed /v1/payments, which sits at a mounted router's root.)
func headAsGet(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		get := r.WithContext(r.Context())
		get.Method = http.MethodGet
		next.ServeHTTP(bodiless{w}, get)
	})
}

// bodiless discards the body of a response to HEAD.
type bodiless struct{ http.ResponseWriter }

func (b bodiless) Write(p []byte) (int, error) { return len(p), nil }

// timeout bounds a request's work: database calls honour the context, and an
// expired one surfaces as context.DeadlineExceeded, which maps to 503.
func timeout(d time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), d)
			defer cancel()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// authenticate reads the bearer secret into the request's credentials, and
// refuses with 401 a header that cannot hold one. It does not go to the
// database: the request's transaction checks the credentials in its first
// statement (auth.Credentials), so that checking them costs no round trip
// of its own. Replays are checked the same way, so a revoked key never sees
// a stored response. keys tells the credentials their principal when the
// key was authenticated before (auth.KeyPrincipals). Every request is
// counted against its rate limit first (limiter), so no caller over it
// costs the database anything.
func authenticate(log *slog.Logger, keys *auth.KeyPrincipals, limits *limiter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := keys.Parse(r.Header.Get("Authorization"))
			if !limits.allow(w, r, c, err == nil) {
				writeError(w, r, log, errRateLimited)
				return
			}
			if err != nil {
				writeError(w, r, log, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(auth.WithCredentials(r.Context(), c)))
		})
	}
}

type scopeKey struct{}

// requireScope names the scope the route needs. The transaction that
// authenticates the caller checks it, before any idempotency work, so a
// replay is re-authorized too; a key without it gets 403.
func requireScope(scope string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, scope)))
		})
	}
}

// caller returns the request's credentials and the scope its route needs.
func caller(r *http.Request) (auth.Credentials, string, error) {
	c, ok := auth.CredentialsFrom(r.Context())
	scope, _ := r.Context().Value(scopeKey{}).(string)
	if !ok || scope == "" {
		return auth.Credentials{}, "", auth.ErrUnauthenticated
	}
	return c, scope, nil
}
