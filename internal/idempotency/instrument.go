package idempotency

import (
	"context"
	"fmt"
	"github.com/google/uuid"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// instruments are the Executor's tracer and metrics.
type instruments struct {
	tracer   trace.Tracer
	requests metric.Int64Counter
	claimDur metric.Float64Histogram
}

// instrumentationName names this package's tracer and meter.
const instrumentationName = "github.com/payments-reference/idempotent-payments/internal/idempotency"

func newInstruments(cfg Config) (instruments, error) {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	meter := mp.Meter(instrumentationName)
	requests, err := meter.Int64Counter("idempotency_requests",
		metric.WithDescription("Requests that reached the idempotency store, by endpoint and outcome (claimed, replayed, conflict, mismatch, quota_exceeded)."))
	if err != nil {
		return instruments{}, fmt.Errorf("idempotency_requests counter: %w", err)
	}
	claimDur, err := meter.Float64Histogram("idempotency_claim_duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time of the claim statement alone, including any wait for a concurrent duplicate, by endpoint."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
	if err != nil {
		return instruments{}, fmt.Errorf("idempotency_claim_duration histogram: %w", err)
	}
	return instruments{tracer: tp.Tracer(instrumentationName), requests: requests, claimDur: claimDur}, nil
}

// observation is one Do's span and metrics. The span, named "idempotency",
// says the outcome, the endpoint and the principal (never the key, the body
// or the response); a replay's span links to the span of the attempt that
// did the work, whose traceparent the claim stores.
type observation struct {
	inst        instruments
	req         Request
	span        trace.Span
	traceParent string
}

// observe starts req's span.
func (in instruments) observe(ctx context.Context, req Request) (context.Context, *observation) {
	ctx, span := in.tracer.Start(ctx, "idempotency", trace.WithAttributes(
		attribute.String("idempotency.endpoint", req.Endpoint),
	))
	return ctx, &observation{inst: in, req: req, span: span, traceParent: formatTraceParent(span.SpanContext())}
}

// authenticated names the principal the claim's round trip authenticated.
func (o *observation) authenticated(principal uuid.UUID) {
	o.span.SetAttributes(attribute.String("idempotency.principal_id", principal.String()))
}

// claimed records the claim's round trip (authentication, claim, lookup),
// waits included.
func (o *observation) claimed(ctx context.Context, start time.Time) {
	o.inst.claimDur.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("endpoint", o.req.Endpoint)))
}

// end records the outcome and ends the span. A mismatch, a conflict and a
// quota refusal are answers, not failures of the service.
func (o *observation) end(ctx context.Context, outcome string, err error) {
	if outcome != "" {
		o.span.SetAttributes(attribute.String("idempotency.outcome", outcome))
		o.inst.requests.Add(ctx, 1, metric.WithAttributes(
			attribute.String("endpoint", o.req.Endpoint), attribute.String("outcome", outcome)))
	}
	if err != nil && outcome != OutcomeMismatch && outcome != OutcomeConflict && outcome != OutcomeQuotaExceeded {
		o.span.RecordError(err)
		o.span.SetStatus(codes.Error, "idempotent operation failed")
	}
	o.span.End()
}

// linkToOriginal lets a trace viewer jump from a replay to the request that
// did the work.
func (o *observation) linkToOriginal(rec record) {
	o.span.SetAttributes(attribute.String("idempotency.original_request_id", rec.OriginalRequestID))
	if rec.TraceParent == "" {
		return
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": rec.TraceParent})
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		o.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attribute.String("idempotency.link", "original"),
			attribute.String("idempotency.original_request_id", rec.OriginalRequestID),
		}})
	}
}

// formatTraceParent renders sc as a W3C traceparent header value, or ""
// when there is no valid span.
func formatTraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier.Get("traceparent")
}
