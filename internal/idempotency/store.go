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
// On a conflict DO NOTHING does nothing at all: no row lock, no transaction
// id, no WAL. So a replay, which is a conflict followed by lookup, is a
// read-only transaction, and its COMMIT waits for no WAL flush. (DO UPDATE
// with a false WHERE would lock the row, which needs a transaction id and a
// WAL record, and made every replay pay a write's commit.)
//
// $7 is false when the principal is over its key quota: then no row is
// offered for insertion at all, and the caller can still replay an existing
// key but not create one.
const claimSQL = `
INSERT INTO idempotency_keys
    (principal_id, endpoint, key, state, fingerprint, correlation_id, trace_parent, expires_at)
SELECT $1, $2, $3, 'in_progress', $4, $5, NULLIF($8, ''), now() + $6 * interval '1 millisecond'
WHERE $7
ON CONFLICT (principal_id, endpoint, key) DO NOTHING
RETURNING created_at`

// claim tries to take the key. It reports whether this transaction now owns
// it.
func claim(ctx context.Context, tx pgx.Tx, s Scope, fingerprint []byte, requestID, traceParent string, ttl time.Duration, allowNew bool) (bool, error) {
	var createdAt time.Time
	err := tx.QueryRow(ctx, claimSQL, s.Principal, s.Endpoint, s.Key, fingerprint, requestID, ttl.Milliseconds(), allowNew, traceParent).Scan(&createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// takeOverSQL claims a key whose row is past its expires_at: outside the
// published window the key counts as absent, so a late retry executes as a
// new request and never replays a response outside the promise. It is a
// write, and only a late retry pays it.
//
// It is atomic against everything that can race it:
//   - another attempt taking the same row over: the second UPDATE waits for
//     the first one's row lock, then re-checks expires_at on the new
//     version, finds it live and updates nothing;
//   - the sweeper: it locks rows before deleting them (SKIP LOCKED) and
//     re-checks expires_at, so it never deletes a row taken over here; a
//     row it deleted first is gone, this updates nothing, and the caller's
//     next INSERT creates the key afresh.
//
// now() is the transaction's start, the same instant lookup compared with.
const takeOverSQL = `
UPDATE idempotency_keys
SET state = 'in_progress', fingerprint = $4,
    response_status = NULL, response_content_type = NULL, response_body = NULL, response_ref = NULL,
    correlation_id = $5, trace_parent = NULLIF($7, ''), created_at = now(), expires_at = now() + $6 * interval '1 millisecond'
WHERE principal_id = $1 AND endpoint = $2 AND key = $3 AND expires_at < now()
RETURNING created_at`

// takeOver claims s's expired row. It reports whether this transaction now
// owns the key; false means there was no expired row to take (any more).
func takeOver(ctx context.Context, tx pgx.Tx, s Scope, fingerprint []byte, requestID, traceParent string, ttl time.Duration) (bool, error) {
	var createdAt time.Time
	err := tx.QueryRow(ctx, takeOverSQL, s.Principal, s.Endpoint, s.Key, fingerprint, requestID, ttl.Milliseconds(), traceParent).Scan(&createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// lookup reads the record that made a claim conflict, without locking it.
// Under READ COMMITTED this statement takes a new snapshot, so it sees the
// row of the transaction the claim waited for. It finds nothing when that
// row was removed since (a sweeper deleting an expired row), or when the row
// is past its expires_at: outside the published window a key counts as
// absent, and the caller takes it over (takeOver) instead of replaying it.
//
// No lock is needed to replay: the row is live, the sweeper deletes only
// expired rows, and this statement's snapshot already holds the response.
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
