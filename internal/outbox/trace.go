package outbox

import (
	"context"
	"encoding/json"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// requestTrace puts every attempt of a job into the trace of the request
// that inserted it: a span "outbox <kind>" whose parent is the request's
// span, read from the traceparent otelriver stored in the job's metadata.
// So one trace shows the request, each attempt of its job, and the
// processor calls they made. (otelriver's own work span starts a trace of
// its own, linked to the request's: River's choice, since a job may run
// long after its request.)
type requestTrace struct {
	river.WorkerMiddlewareDefaults
	tracer trace.Tracer
}

func newRequestTrace(tp trace.TracerProvider) *requestTrace {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	return &requestTrace{tracer: tp.Tracer(instrumentationName)}
}

// Work implements rivertype.WorkerMiddleware.
func (m *requestTrace) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	var meta map[string]any
	_ = json.Unmarshal(job.Metadata, &meta) // no metadata, no parent
	carrier := propagation.MapCarrier{}
	for k, v := range meta {
		if s, ok := v.(string); ok {
			carrier[k] = s
		}
	}
	parent := propagation.TraceContext{}.Extract(ctx, carrier)
	ctx, span := m.tracer.Start(parent, "outbox "+job.Kind, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.Int64("river.job.id", job.ID), attribute.Int("river.job.attempt", job.Attempt)))
	defer span.End()
	err := doInner(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
