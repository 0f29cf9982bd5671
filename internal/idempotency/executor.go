package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
}

// Config sets the executor's bounds.
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
}

// Executor runs Operations under idempotency keys.
type Executor struct {
	pool *database.Pool
	cfg  Config
}

// NewExecutor returns an Executor that runs its transactions on pool, which
// must connect as the service role so row-level security applies.
func NewExecutor(pool *database.Pool, cfg Config) *Executor {
	return &Executor{pool: pool, cfg: cfg}
}

// errResponseTooLarge is a programming error: an endpoint whose responses
// can exceed the cap must set Outcome.ResourceRef.
var errResponseTooLarge = errors.New("response over the storage cap and no resource reference to store instead")

// maxClaimAttempts bounds the loop in Do. A second attempt is needed only when
// the conflicting row vanished between the claim and the lookup.
const maxClaimAttempts = 3

// Do runs op under req's key in one transaction, or replays the response an
// earlier attempt stored:
//
//  1. claim the key with one INSERT ... ON CONFLICT (waiting for a concurrent
//     attempt with the same key, if there is one);
//  2. if the claim succeeded: execute, store the response on the claimed
//     row, commit once;
//  3. if not: read the stored row; a different fingerprint is ErrKeyReused,
//     the same one is replayed after op.Reauthorize.
//
// Any error rolls the whole transaction back, claim included.
func (e *Executor) Do(ctx context.Context, req Request, op Operation) (Result, error) {
	allowNew := true
	if e.cfg.Quota != nil {
		var err error
		if allowNew, err = e.cfg.Quota.Allow(ctx, req.Principal); err != nil {
			return Result{}, err
		}
	}
	var res Result
	err := database.InTenantTx(ctx, e.pool, req.Principal, database.TxOptions{LockTimeout: e.cfg.LockTimeout}, func(tx pgx.Tx) error {
		for range maxClaimAttempts {
			claimed, err := claim(ctx, tx, req.Scope, req.Fingerprint, req.RequestID, e.cfg.Retention, allowNew)
			if database.IsLockTimeout(err) {
				return ErrRequestInProgress
			}
			if err != nil {
				return fmt.Errorf("claim key: %w", database.Classify(err))
			}
			if claimed {
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
				res = Result{Response: out.Response, OriginalRequestID: req.RequestID}
				return nil
			}

			rec, found, err := lookup(ctx, tx, req.Scope)
			if err != nil {
				return fmt.Errorf("look up key: %w", database.Classify(err))
			}
			if !found && !allowNew {
				return ErrQuotaExceeded
			}
			if !found {
				continue
			}
			if !bytes.Equal(rec.Fingerprint, req.Fingerprint) {
				return ErrKeyReused
			}
			if rec.State == StateInProgress {
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
			res = Result{Response: rec.Response, Replayed: true, OriginalRequestID: rec.OriginalRequestID}
			return nil
		}
		return fmt.Errorf("claim key: row vanished %d times in a row", maxClaimAttempts)
	})
	if err != nil {
		return Result{}, err
	}
	if !res.Replayed && e.cfg.Quota != nil {
		e.cfg.Quota.Record(req.Principal)
	}
	return res, nil
}
