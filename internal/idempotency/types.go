package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

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
	// Secret marks a body that holds a secret the store must not keep (a
	// webhook endpoint's signing secret): only ResourceRef is stored, as
	// for a body over the cap, and a replay re-derives the body.
	Secret bool
	// Writes are the operation's writes whose values are already known in
	// Go (a payment's insert and its job's). The executor sends them with
	// the statement that stores the response, in one round trip; an error
	// from any of them rolls everything back like an error from Execute.
	Writes []database.Statement
}

// Operation is an endpoint's part of the protocol.
type Operation struct {
	// Execute does the business write in the claiming transaction and
	// renders the response. Returning an error rolls back everything,
	// including the claim: nothing is stored and a retry executes afresh.
	Execute func(ctx context.Context, w Work) (Outcome, error)
	// Reauthorize, when set, runs before a stored response is replayed, in
	// the same transaction, to check that the caller, principal, may still
	// see it.
	Reauthorize func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) error
	// Rederive renders the response body again from the resource named by
	// ref, for a replay whose body was not stored. It must only read: a
	// replay never executes the request again. The body shows the resource
	// as it is now, which may differ from the original; the status and the
	// content type are the stored ones, so Rederive returns only a body.
	Rederive func(ctx context.Context, tx pgx.Tx, principal uuid.UUID, ref string) ([]byte, error)
}

// Work is where an Operation does its business write.
type Work struct {
	// Tx is the claiming transaction, for statements whose results the
	// operation needs before it can go on (a row to lock and check); its
	// other writes are best returned as Outcome.Writes, which saves a round
	// trip.
	Tx pgx.Tx
	// Now is the transaction's now(), which every now() in it returns: a
	// response can show a created_at before its row is written.
	Now time.Time
	// Principal is the authenticated caller, the transaction's tenant.
	Principal uuid.UUID
	// RequestID and Key name the request that executes: what a resource
	// it creates records as its origin (its events name it).
	RequestID, Key string
	// Intent names the client's intent (IntentKey): the same for every
	// retry of this request, whether or not an earlier attempt's commit
	// survived. It is the idempotency key of the external call the
	// operation causes (a processor's charge).
	Intent string
}

// Request is one attempt to run an Operation under a key.
type Request struct {
	// Authenticate returns the statement that authenticates the caller and
	// sets the transaction's tenant (auth.Credentials.Authentication), and
	// where the caller's principal will be once it has run. The executor
	// sends it first in the claim's round trip; when it fails, nothing
	// after it runs and Do returns its error.
	Authenticate func() (stmt database.Statement, principal *uuid.UUID)
	// Principal is the caller's principal when it is known before the
	// authentication has answered (auth.Credentials.Principal), or
	// uuid.Nil. The claim names it, so that it can travel in the
	// authentication's round trip and still name its principal as every
	// tenant statement does (docs/scaling.md); when it is not known, the
	// executor sends the authentication alone first, one round trip more.
	// It grants nothing: the authentication decides, and a principal that
	// is not the authenticated one fails the request.
	Principal uuid.UUID
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
