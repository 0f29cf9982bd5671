package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

var (
	// ErrKeyReused means the key was already used, in this principal's scope
	// and on this endpoint, for a request with a different fingerprint.
	// Nothing was executed.
	ErrKeyReused = errors.New("idempotency key reused with a different request")
	// ErrRequestInProgress means another attempt with the same key is still
	// running and did not finish within the lock timeout. Nothing was
	// executed; the client should retry later.
	ErrRequestInProgress = errors.New("a request with this idempotency key is in progress")
	// ErrQuotaExceeded means the principal holds as many live keys as its
	// quota allows; an existing key can still be replayed. Nothing was
	// executed.
	ErrQuotaExceeded = errors.New("idempotency key quota exceeded")
)

// Response is what a client receives, stored byte for byte for replays.
type Response struct {
	Status      int
	ContentType string
	Body        []byte
}

// Outcome is what an Operation produced. Failed marks a business rejection
// that happened after execution began (for example a refund larger than what
// remains): it is stored and replayed like a success, with state failed.
type Outcome struct {
	Response
	Failed bool
	// ResourceRef names the resource the response shows (its id). When the
	// body is larger than Config.MaxStoredResponseBytes, the ref is stored
	// instead and a replay calls Operation.Rederive with it.
	ResourceRef string
}

// Operation is an endpoint's part of the protocol.
type Operation struct {
	// Execute does the business write in tx, the claiming transaction, and
	// renders the response. Returning an error rolls back everything,
	// including the claim: nothing is stored and a retry executes afresh.
	Execute func(ctx context.Context, tx pgx.Tx) (Outcome, error)
	// Reauthorize, when set, runs before a stored response is replayed, in
	// the same transaction, to check that the caller may still see it.
	Reauthorize func(ctx context.Context, tx pgx.Tx) error
	// Rederive renders the response again from the resource named by ref,
	// for a replay whose body was too large to store. It must only read:
	// a replay never executes the request again. The response shows the
	// resource as it is now, which may differ from the original.
	Rederive func(ctx context.Context, tx pgx.Tx, ref string) (Response, error)
}

// Request is one attempt to run an Operation under a key.
type Request struct {
	Scope
	// Fingerprint of the request, from Fingerprint.
	Fingerprint []byte
	// RequestID of this attempt; stored as correlation_id when it executes.
	RequestID string
}

// Result is what to send back.
type Result struct {
	Response
	// Replayed is true when Response was stored by an earlier attempt.
	Replayed bool
	// OriginalRequestID is the request id of the attempt that produced
	// Response; it equals the Request's own id when not Replayed.
	OriginalRequestID string
	// ClaimDuration is how long the claim statement took, waiting for a
	// concurrent duplicate included.
	ClaimDuration time.Duration
}

// Config sets the executor's bounds and instruments.
type Config struct {
	// Retention is how long a key is kept after its claim: the published
	// retry window plus a safety margin.
	Retention time.Duration
	// LockTimeout bounds the wait for a concurrent attempt with the same key.
	LockTimeout time.Duration
	// MaxStoredResponseBytes caps a stored body; a larger one is stored as
	// its Outcome.ResourceRef. Zero means no cap.
	MaxStoredResponseBytes int
	// Quota, when set, limits the live keys of each principal.
	Quota *Quota
	// TracerProvider and MeterProvider instrument the protocol; nil means
	// no telemetry.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Outcomes of Do, as recorded in spans and metrics.
const (
	OutcomeClaimed       = "claimed"
	OutcomeReplayed      = "replayed"
	OutcomeConflict      = "conflict"
	OutcomeMismatch      = "mismatch"
	OutcomeQuotaExceeded = "quota_exceeded"
)

// Executor runs Operations under idempotency keys.
type Executor struct {
	pool     *database.Pool
	cfg      Config
	tracer   trace.Tracer
	requests metric.Int64Counter
	claimDur metric.Float64Histogram
}

// NewExecutor returns an Executor that runs its transactions on pool, which
// must connect as the service role so row-level security applies.
func NewExecutor(pool *database.Pool, cfg Config) (*Executor, error) {
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
		return nil, fmt.Errorf("idempotency_requests counter: %w", err)
	}
	claimDur, err := meter.Float64Histogram("idempotency_claim_duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time of the claim statement alone, including any wait for a concurrent duplicate, by endpoint."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
	if err != nil {
		return nil, fmt.Errorf("idempotency_claim_duration histogram: %w", err)
	}
	return &Executor{pool: pool, cfg: cfg, tracer: tp.Tracer(instrumentationName), requests: requests, claimDur: claimDur}, nil
}

// instrumentationName names this package's tracer and meter.
const instrumentationName = "github.com/payments-reference/idempotent-payments/internal/idempotency"

// errResponseTooLarge is a programming error: an endpoint whose responses
// can exceed the cap must set Outcome.ResourceRef.
var errResponseTooLarge = errors.New("response over the storage cap and no resource reference to store instead")

// maxClaimAttempts bounds the loop in Do. A second attempt is needed only when
// the conflicting row vanished between the claim and the lookup.
const maxClaimAttempts = 3

// Do runs op under req's key in one transaction, or replays the response an
// earlier attempt stored:
//
//  1. claim the key with one INSERT ... ON CONFLICT DO NOTHING (waiting for
//     a concurrent attempt with the same key, if there is one);
//  2. if the claim succeeded: execute, store the response on the claimed
//     row, commit once;
//  3. if not: read the stored row without locking it; a different
//     fingerprint is ErrKeyReused, the same one is replayed after
//     op.Reauthorize, and the transaction writes nothing;
//  4. if the row is past its window: take it over (one UPDATE that re-checks
//     expires_at) and continue as in 2.
//
// Any error rolls the whole transaction back, claim included.
//
// The step runs in a span named "idempotency" whose attributes say the
// outcome, the endpoint and the principal (never the key, the body or the
// response). A replay's span links to the span of the attempt that did the
// work.
func (e *Executor) Do(ctx context.Context, req Request, op Operation) (res Result, err error) {
	ctx, span := e.tracer.Start(ctx, "idempotency", trace.WithAttributes(
		attribute.String("idempotency.endpoint", req.Endpoint),
		attribute.String("idempotency.principal_id", req.Principal.String()),
	))
	outcome := ""
	defer func() {
		if outcome != "" {
			span.SetAttributes(attribute.String("idempotency.outcome", outcome))
			e.requests.Add(ctx, 1, metric.WithAttributes(
				attribute.String("endpoint", req.Endpoint), attribute.String("outcome", outcome)))
		}
		if err != nil && outcome != OutcomeMismatch && outcome != OutcomeConflict && outcome != OutcomeQuotaExceeded {
			span.RecordError(err)
			span.SetStatus(codes.Error, "idempotent operation failed")
		}
		span.End()
	}()

	allowNew := true
	if e.cfg.Quota != nil {
		if allowNew, err = e.cfg.Quota.Allow(ctx, req.Principal); err != nil {
			return Result{}, err
		}
	}
	traceParent := formatTraceParent(span.SpanContext())
	err = database.InTenantTx(ctx, e.pool, req.Principal, database.TxOptions{LockTimeout: e.cfg.LockTimeout}, func(tx pgx.Tx) error {
		for range maxClaimAttempts {
			start := time.Now()
			claimed, err := claim(ctx, tx, req.Scope, req.Fingerprint, req.RequestID, traceParent, e.cfg.Retention, allowNew)
			res.ClaimDuration = time.Since(start)
			e.claimDur.Record(ctx, res.ClaimDuration.Seconds(), metric.WithAttributes(attribute.String("endpoint", req.Endpoint)))
			if database.IsLockTimeout(err) {
				outcome = OutcomeConflict
				return ErrRequestInProgress
			}
			if err != nil {
				return fmt.Errorf("claim key: %w", database.Classify(err))
			}
			if claimed {
				return e.execute(ctx, tx, req, op, &res)
			}

			rec, found, err := lookup(ctx, tx, req.Scope)
			if err != nil {
				return fmt.Errorf("look up key: %w", database.Classify(err))
			}
			if !found && !allowNew {
				outcome = OutcomeQuotaExceeded
				return ErrQuotaExceeded
			}
			if !found {
				// Expired, or deleted since the claim: take an expired row
				// over; if there is none any more, claim again.
				taken, err := takeOver(ctx, tx, req.Scope, req.Fingerprint, req.RequestID, traceParent, e.cfg.Retention)
				if database.IsLockTimeout(err) {
					outcome = OutcomeConflict
					return ErrRequestInProgress
				}
				if err != nil {
					return fmt.Errorf("take over expired key: %w", database.Classify(err))
				}
				if !taken {
					continue
				}
				return e.execute(ctx, tx, req, op, &res)
			}
			if !bytes.Equal(rec.Fingerprint, req.Fingerprint) {
				outcome = OutcomeMismatch
				return ErrKeyReused
			}
			if rec.State == StateInProgress {
				outcome = OutcomeConflict
				return ErrRequestInProgress
			}
			if op.Reauthorize != nil {
				if err := op.Reauthorize(ctx, tx); err != nil {
					return err
				}
			}
			if rec.ResourceRef != "" {
				// Status and content type are stored; only the body is re-rendered.
				again, err := op.Rederive(ctx, tx, rec.ResourceRef)
				if err != nil {
					return fmt.Errorf("re-derive stored response: %w", err)
				}
				rec.Response.Body = again.Body
			}
			linkToOriginal(span, rec)
			res.Response, res.Replayed, res.OriginalRequestID = rec.Response, true, rec.OriginalRequestID
			return nil
		}
		return fmt.Errorf("claim key: row vanished %d times in a row", maxClaimAttempts)
	})
	if err != nil {
		return Result{}, err
	}
	// Counted only once the transaction committed: a claim that rolled back
	// did not happen.
	if res.Replayed {
		outcome = OutcomeReplayed
	} else {
		outcome = OutcomeClaimed
		if e.cfg.Quota != nil {
			e.cfg.Quota.Record(req.Principal)
		}
	}
	return res, nil
}

// execute runs op in the transaction that owns the key and stores its
// outcome on the claimed row.
func (e *Executor) execute(ctx context.Context, tx pgx.Tx, req Request, op Operation, res *Result) error {
	out, err := op.Execute(ctx, tx)
	if err != nil {
		return err
	}
	state := StateCompleted
	if out.Failed {
		state = StateFailed
	}
	ref := ""
	if e.cfg.MaxStoredResponseBytes > 0 && len(out.Body) > e.cfg.MaxStoredResponseBytes {
		if out.ResourceRef == "" || op.Rederive == nil {
			return errResponseTooLarge
		}
		ref = out.ResourceRef
	}
	if err := complete(ctx, tx, req.Scope, state, out.Response, ref); err != nil {
		return fmt.Errorf("store response: %w", database.Classify(err))
	}
	res.Response, res.OriginalRequestID = out.Response, req.RequestID
	return nil
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

// linkToOriginal lets a trace viewer jump from a replay to the request that
// did the work.
func linkToOriginal(span trace.Span, rec record) {
	span.SetAttributes(attribute.String("idempotency.original_request_id", rec.OriginalRequestID))
	if rec.TraceParent == "" {
		return
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": rec.TraceParent})
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attribute.String("idempotency.link", "original"),
			attribute.String("idempotency.original_request_id", rec.OriginalRequestID),
		}})
	}
}
