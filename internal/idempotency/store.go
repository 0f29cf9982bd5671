package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// State is where a key's record is in its life.
type State string

// The states a record moves through. A claim inserts StateInProgress; the same
// transaction moves it to StateCompleted or StateFailed before committing, so
// other transactions normally never see StateInProgress.
const (
	StateInProgress State = "in_progress"
	StateCompleted  State = "completed"
	StateFailed     State = "failed"
)

// Scope identifies one record: the idempotency key is unique per principal and
// per endpoint (route template), never globally.
type Scope struct {
	Principal uuid.UUID
	Endpoint  string
	Key       string
}

// record is a stored key as a replay needs it.
type record struct {
	State             State
	Fingerprint       []byte
	Response          Response
	ResourceRef       string // set instead of Response.Body when the body was over the cap
	OriginalRequestID string
	TraceParent       string // W3C traceparent of the producing attempt's span, or ""
}

// claimSQL is the whole concurrency control. The INSERT either creates the
// row (the caller now owns the key and will execute) or conflicts with an
// existing one. A conflicting row that another transaction is still writing
// makes this statement wait on the primary key until that transaction ends
// (bounded by lock_timeout).
//
// A conflicting row past its expires_at is outside the published window and
// counts as absent: DO UPDATE takes it over in this same statement, atomically,
// so a late retry executes as a new request and never replays a response
// outside the promise. The sweeper locks rows before deleting them (SKIP
// LOCKED) and re-checks expires_at, so it never deletes a row taken over here.
// For a live row the WHERE is false and nothing comes back, as with DO
// NOTHING, except that the row stays locked (FOR UPDATE) until the
// transaction ends: a replay's transaction is short, and the lock is what
// keeps the sweeper away.
//
// $7 is false when the principal is over its key quota: then no row is
// offered for insertion at all, and the caller can still replay an existing
// key but not create one.
const claimSQL = `
INSERT INTO idempotency_keys AS k
    (principal_id, endpoint, key, state, fingerprint, correlation_id, trace_parent, expires_at)
SELECT $1, $2, $3, 'in_progress', $4, $5, $8, now() + $6 * interval '1 millisecond'
WHERE $7
ON CONFLICT (principal_id, endpoint, key) DO UPDATE
    SET state = 'in_progress', fingerprint = EXCLUDED.fingerprint,
        response_status = NULL, response_content_type = NULL, response_body = NULL, response_ref = NULL,
        correlation_id = EXCLUDED.correlation_id, trace_parent = EXCLUDED.trace_parent,
        created_at = now(), expires_at = EXCLUDED.expires_at
    WHERE k.expires_at < now()
RETURNING created_at`

// claim tries to take the key. It reports whether this transaction now owns
// it.
func claim(ctx context.Context, tx pgx.Tx, s Scope, fingerprint []byte, requestID, traceParent string, ttl time.Duration, allowNew bool) (bool, error) {
	var createdAt time.Time
	var tp *string
	if traceParent != "" {
		tp = &traceParent
	}
	err := tx.QueryRow(ctx, claimSQL, s.Principal, s.Endpoint, s.Key, fingerprint, requestID, ttl.Milliseconds(), allowNew, tp).Scan(&createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// lookup reads the record that made a claim conflict. Under READ COMMITTED
// this statement takes a new snapshot, so it sees the row of the transaction
// the claim waited for. It can find nothing when that row was removed since
// (a sweeper deleting an expired row).
//
// A row past its expires_at is outside the published window and counts as
// absent here too, as in the claim: an over-quota claim offers no row, so it
// does not take an expired one over, and without this filter its stored
// response would be replayed past the window. now() is the transaction's
// start, the same instant the claim compared with.
func lookup(ctx context.Context, tx pgx.Tx, s Scope) (record, bool, error) {
	var r record
	var status *int16
	err := tx.QueryRow(ctx, `
		SELECT state, fingerprint, response_status, coalesce(response_content_type, ''),
		       coalesce(response_body, ''::bytea), coalesce(response_ref, ''), correlation_id, coalesce(trace_parent, '')
		FROM idempotency_keys
		WHERE principal_id = $1 AND endpoint = $2 AND key = $3 AND expires_at >= now()`,
		s.Principal, s.Endpoint, s.Key).
		Scan(&r.State, &r.Fingerprint, &status, &r.Response.ContentType, &r.Response.Body, &r.ResourceRef, &r.OriginalRequestID, &r.TraceParent)
	if errors.Is(err, pgx.ErrNoRows) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	if status != nil {
		r.Response.Status = int(*status)
	}
	return r, true, nil
}

// complete stores the outcome on the claimed row, in the claiming
// transaction: either the body or, when it is over the cap, ref.
func complete(ctx context.Context, tx pgx.Tx, s Scope, state State, resp Response, ref string) error {
	body, refArg := resp.Body, &ref
	if ref == "" {
		refArg = nil
	} else {
		body = nil
	}
	tag, err := tx.Exec(ctx, `
		UPDATE idempotency_keys
		SET state = $4, response_status = $5, response_content_type = $6, response_body = $7, response_ref = $8
		WHERE principal_id = $1 AND endpoint = $2 AND key = $3 AND state = 'in_progress'`,
		s.Principal, s.Endpoint, s.Key, string(state), resp.Status, resp.ContentType, body, refArg)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("claimed row not found in state in_progress (updated %d rows)", tag.RowsAffected())
	}
	return nil
}
