package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// This file is the protocol, top to bottom: claim, wait, replay, take over,
// execute, complete, and the Executor that runs it. Its SQL is in store.go,
// one statement per step; its spans and metrics are in instrument.go,
// around it.

// maxClaimAttempts bounds the loop in run. A second attempt is needed only
// when the conflicting row vanished between the claim and the lookup.
const maxClaimAttempts = 3

// errResponseTooLarge is a programming error: an endpoint whose responses
// can exceed the cap must set Outcome.ResourceRef.
var errResponseTooLarge = errors.New("response over the storage cap and no resource reference to store instead")

// Executor runs Operations under idempotency keys.
type Executor struct {
	pool *database.Pool
	cfg  Config
	inst instruments // instrument.go
}

// NewExecutor returns an Executor that runs its transactions on pool, which
// must connect as the service role so row-level security applies.
func NewExecutor(pool *database.Pool, cfg Config) (*Executor, error) {
	inst, err := newInstruments(cfg)
	if err != nil {
		return nil, err
	}
	return &Executor{pool: pool, cfg: cfg, inst: inst}, nil
}

// Do runs op under req's key in one transaction, or replays the response an
// earlier attempt stored:
//
//  1. authenticate the caller and claim the key, in one round trip: the
//     authentication (which sets the tenant), one INSERT ... ON CONFLICT DO
//     NOTHING (waiting for a concurrent attempt with the same key, if there
//     is one), and the lookup of the row it conflicted with (the first
//     request with a key this process has not authenticated before
//     authenticates in a round trip of its own: Request.Principal);
//  2. if the claim succeeded: execute, store the response on the claimed
//     row, commit once;
//  3. if not: the looked-up row with a different fingerprint is
//     ErrKeyReused; with the same one it is replayed after
//     op.Reauthorize, and the transaction writes no row (with a
//     synchronous standby it writes a WAL record, so that its COMMIT waits
//     for the standby as the original's did);
//  4. if the row is past its window: take it over (one UPDATE that re-checks
//     expires_at) and continue as in 2.
//
// Any error rolls the whole transaction back, claim included. A new
// request takes four round trips (BEGIN, step 1, the operation's writes
// with the response, COMMIT), a replay three (docs/performance.md).
func (e *Executor) Do(ctx context.Context, req Request, op Operation) (Result, error) {
	ctx, obs := e.inst.observe(ctx, req)
	res, outcome, err := e.run(ctx, req, op, obs)
	obs.end(ctx, outcome, err)
	return res, err
}

// run is Do without the instruments. It returns the outcome to record.
func (e *Executor) run(ctx context.Context, req Request, op Operation, obs *observation) (res Result, outcome string, err error) {
	var principal uuid.UUID
	err = database.InTx(ctx, e.pool, database.TxOptions{LockTimeout: e.cfg.LockTimeout}, func(tx pgx.Tx) error {
		pending, caller, err := authenticate(ctx, tx, req)
		if err != nil {
			return err
		}
		principal = caller.named
		for range maxClaimAttempts {
			// 1. Claim. The unique index on (principal, endpoint, key) is the
			// only concurrency control: a concurrent attempt's uncommitted
			// row makes this statement wait until that attempt ends (at most
			// LOCK_TIMEOUT), and then it sees the outcome.
			var c claimed
			pending = append(pending, claim(principal, req.Scope, req.Fingerprint, req.RequestID, obs.traceParent, e.cfg.Retention, &c)...)
			start := time.Now()
			err := database.Send(ctx, tx, pending...)
			obs.claimed(ctx, start)
			if database.IsLockTimeout(err) {
				outcome = OutcomeConflict
				return ErrRequestInProgress
			}
			if err != nil {
				return fmt.Errorf("claim key: %w", err)
			}
			pending = nil
			if err := caller.check(); err != nil {
				return err
			}
			obs.authenticated(principal)
			if c.owned {
				// The quota is checked once the claim is ours: a principal at
				// its limit may still replay, but may not claim a new key,
				// and this claim then rolls back.
				if err := e.cfg.Quota.allowNew(ctx, tx, principal); err != nil {
					outcome = OutcomeQuotaExceeded
					return err
				}
				return e.execute(ctx, tx, req, principal, c.now, op, &res) // 2.
			}
			if !c.found {
				// 4. Expired (a late retry), or deleted since the claim. Take
				// the expired row over; if another late retry took it first,
				// the UPDATE waited for it and, re-checking expires_at,
				// takes nothing: claim again and replay that one.
				if err := e.cfg.Quota.allowNew(ctx, tx, principal); err != nil {
					outcome = OutcomeQuotaExceeded
					return err
				}
				taken, now, err := takeOver(ctx, tx, principal, req.Scope, req.Fingerprint, req.RequestID, obs.traceParent, e.cfg.Retention)
				if database.IsLockTimeout(err) {
					outcome = OutcomeConflict
					return ErrRequestInProgress
				}
				if err != nil {
					return fmt.Errorf("take over expired key: %w", err)
				}
				if !taken {
					continue
				}
				return e.execute(ctx, tx, req, principal, now, op, &res)
			}
			// 3. The key is taken, and its holder has finished (the claim
			// waited for it). The lookup read the row without locking it: a
			// replay writes no row, not even a lock (docs/performance.md).
			if !bytes.Equal(c.rec.Fingerprint, req.Fingerprint) {
				// One key, two intents: refuse rather than replay the
				// wrong payment.
				outcome = OutcomeMismatch
				return ErrKeyReused
			}
			if c.rec.State == StateInProgress {
				outcome = OutcomeConflict
				return ErrRequestInProgress
			}
			return e.replay(ctx, tx, op, principal, c.rec, &res, obs)
		}
		return fmt.Errorf("claim key: row vanished %d times in a row", maxClaimAttempts)
	})
	if err != nil {
		return Result{}, outcome, err
	}
	// Counted only once the transaction committed: a claim that rolled back
	// did not happen.
	if res.Replayed {
		return res, OutcomeReplayed, nil
	}
	if e.cfg.Quota != nil {
		e.cfg.Quota.Record(principal)
	}
	return res, OutcomeClaimed, nil
}

// execute runs op in the transaction that owns the key and stores its
// outcome on the claimed row: the business write and the response commit
// together, or neither does. The operation's writes (Outcome.Writes) and
// the response travel in one round trip.
func (e *Executor) execute(ctx context.Context, tx pgx.Tx, req Request, principal uuid.UUID, now time.Time, op Operation, res *Result) error {
	out, err := op.Execute(ctx, Work{Tx: tx, Now: now, Principal: principal, RequestID: req.RequestID, Key: req.Key,
		Intent: IntentKey(principal, req.Scope, req.Fingerprint)})
	if err != nil {
		return err
	}
	state := StateCompleted
	if out.Failed {
		state = StateFailed
	}
	// A body over the cap is stored as a reference to its resource and
	// re-rendered on replay, so one huge response cannot bloat the table;
	// so is a body holding a secret, so that the table never holds one.
	ref := ""
	if out.Secret || e.cfg.MaxStoredResponseBytes > 0 && len(out.Body) > e.cfg.MaxStoredResponseBytes {
		if out.ResourceRef == "" || op.Rederive == nil {
			return errResponseTooLarge
		}
		ref = out.ResourceRef
	}
	if err := database.Send(ctx, tx, append(out.Writes, complete(principal, req.Scope, state, out.Response, ref))...); err != nil {
		return err
	}
	res.Response, res.OriginalRequestID = out.Response, req.RequestID
	return nil
}

// replay answers with what the original attempt stored, after checking that
// the caller may still see it: a revoked or narrowed key gets no replay
// (authentication, in the claim's round trip, checked both).
func (e *Executor) replay(ctx context.Context, tx pgx.Tx, op Operation, principal uuid.UUID, rec record, res *Result, obs *observation) error {
	if op.Reauthorize != nil {
		if err := op.Reauthorize(ctx, tx, principal); err != nil {
			return err
		}
	}
	if rec.ResourceRef != "" {
		body, err := op.Rederive(ctx, tx, principal, rec.ResourceRef)
		if err != nil {
			return fmt.Errorf("re-derive stored response: %w", err)
		}
		rec.Response.Body = body
	}
	obs.linkToOriginal(rec)
	res.Response, res.Replayed, res.OriginalRequestID = rec.Response, true, rec.OriginalRequestID
	return nil
}
