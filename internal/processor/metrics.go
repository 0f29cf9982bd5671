package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Measured wraps p to record every call's latency and outcome in the
// histogram processor_call_duration_seconds{operation, outcome}: operation is
// charge, refund, lookup or cancel; outcome is succeeded, declined,
// rejected, no_record (lookups and cancels only) or unknown (retried).
func Measured(p Processor, mp metric.MeterProvider) (Processor, error) {
	h, err := mp.Meter("github.com/payments-reference/idempotent-payments/internal/processor").Float64Histogram(
		"processor_call_duration_seconds",
		metric.WithDescription("Processor calls by operation and outcome."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		return nil, fmt.Errorf("processor metrics: %w", err)
	}
	return &measured{p: p, h: h}, nil
}

type measured struct {
	p Processor
	h metric.Float64Histogram
}

func (m *measured) Charge(ctx context.Context, c Charge) (Result, error) {
	start := time.Now()
	r, err := m.p.Charge(ctx, c)
	m.record(ctx, "charge", start, err)
	return r, err
}

func (m *measured) Refund(ctx context.Context, rf Refund) (Result, error) {
	start := time.Now()
	r, err := m.p.Refund(ctx, rf)
	m.record(ctx, "refund", start, err)
	return r, err
}

func (m *measured) Lookup(ctx context.Context, rec Record) (Result, error) {
	return m.ask(ctx, "lookup", rec, m.p.Lookup)
}

func (m *measured) Cancel(ctx context.Context, rec Record) (Result, error) {
	return m.ask(ctx, "cancel", rec, m.p.Cancel)
}

// ask measures a question about a key, whose "no record" is an answer of
// its own.
func (m *measured) ask(ctx context.Context, op string, rec Record, call func(context.Context, Record) (Result, error)) (Result, error) {
	start := time.Now()
	r, err := call(ctx, rec)
	if errors.Is(err, ErrNoRecord) {
		m.h.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("operation", op), attribute.String("outcome", "no_record")))
		return r, err
	}
	m.record(ctx, op, start, err)
	return r, err
}

func (m *measured) record(ctx context.Context, op string, start time.Time, err error) {
	var d *DeclineError
	var rj *RejectedError
	outcome := "succeeded"
	switch {
	case errors.As(err, &d):
		outcome = "declined"
	case errors.As(err, &rj):
		outcome = "rejected"
	case err != nil:
		outcome = "unknown"
	}
	m.h.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("operation", op), attribute.String("outcome", outcome)))
}
