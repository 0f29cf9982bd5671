package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payments-reference/idempotent-payments/internal/database"
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
// per endpoint (route template), never globally. The principal is the
// authenticated caller's: every statement here names it as its first
// parameter, which is what would route it to one shard of a table
// distributed by principal (docs/scaling.md), and row-level security checks
// it against the tenant the authentication set in the database, so a
// statement naming another principal finds no row and inserts none.
type Scope struct {
	Endpoint string
	Key      string
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
// RETURNING created_at gives the transaction's start (the column's default
// is now(), which every now() in the transaction returns): the created_at
// of what the request will write, known before it is written. Not
// RETURNING now(): Citus refuses a function that is not IMMUTABLE in a
// RETURNING clause (docs/scaling.md).
const claimSQL = `
INSERT INTO idempotency_keys
    (principal_id, endpoint, key, state, fingerprint, correlation_id, trace_parent, expires_at)
VALUES ($1, $2, $3, 'in_progress', $4, $5, NULLIF($6, ''), now() + $7 * interval '1 millisecond')
ON CONFLICT (principal_id, endpoint, key) DO NOTHING
RETURNING created_at`

// lookupSQL reads the record that made a claim conflict, without locking it.
// It is sent right behind the claim, in the same round trip, and under READ
// COMMITTED takes a snapshot of its own after the claim's wait, so it sees
// the row of the transaction the claim waited for. When the claim inserted,
// it finds that new row, and the caller ignores it. It finds nothing when the
// row was removed since (a sweeper deleting an expired row), or when the row
// is past its expires_at: outside the published window a key counts as
// absent, and the caller takes it over (takeOver) instead of replaying it.
//
// No lock is needed to replay: the row is live, the sweeper deletes only
// expired rows, and this statement's snapshot already holds the response.
const lookupSQL = `
SELECT state, fingerprint, response_status, coalesce(response_content_type, ''),
       coalesce(response_body, ''::bytea), coalesce(response_ref, ''), correlation_id, coalesce(trace_parent, '')
FROM idempotency_keys
WHERE principal_id = $1 AND endpoint = $2 AND key = $3 AND expires_at >= now()`

// claimed is what the claim's round trip learned.
type claimed struct {
	owned bool      // the claim inserted the row: this transaction owns the key
	now   time.Time // the transaction's now(), when owned
	rec   record    // the row lookup found, when found and not owned
	found bool
}

// claim is principal's claim and the lookup behind it, which fill c when
// they run; with a synchronous standby, also the WAL message that makes a
// replay's COMMIT wait for it.
func claim(principal uuid.UUID, s Scope, fingerprint []byte, requestID, traceParent string, ttl time.Duration, c *claimed) []database.Statement {
	insert := database.Statement{SQL: claimSQL, Args: []any{principal, s.Endpoint, s.Key, fingerprint, requestID, traceParent, ttl.Milliseconds()}, Row: func(row pgx.Row) error {
		err := row.Scan(&c.now)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		c.owned = err == nil
		return err
	}}
	lookup := database.Statement{SQL: lookupSQL, Args: []any{principal, s.Endpoint, s.Key}, Row: func(row pgx.Row) error {
		var status *int16
		r := &c.rec
		err := row.Scan(&r.State, &r.Fingerprint, &status, &r.Response.ContentType, &r.Response.Body, &r.ResourceRef, &r.OriginalRequestID, &r.TraceParent)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up key: %w", err)
		}
		if status != nil {
			r.Response.Status = int(*status)
		}
		c.found = !c.owned
		return nil
	}}
	// Where COMMITs wait for a synchronous standby, a replay's transaction
	// writes WAL too (a logical message, which touches no table), so that
	// its COMMIT waits like a write's for the standby to have the WAL up to
	// it, the original's included. A row whose own COMMIT gave up waiting is
	// committed on the primary only (a failover loses it); its replay then
	// answers outcome-unknown while the standby lags, never a 201 the
	// standby never saw. A transaction that writes no WAL commits without
	// waiting, whatever synchronous_commit says; without a standby the
	// replay stays a read.
	wal := database.Statement{SQL: `SELECT CASE WHEN current_setting('synchronous_standby_names') <> ''
		THEN pg_logical_emit_message(true, 'idempotency', 'replay') END`}
	return []database.Statement{insert, lookup, wal}
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
// now() is the transaction's start, the same instant lookup compared with;
// RETURNING created_at returns it, as the claim's does.
const takeOverSQL = `
UPDATE idempotency_keys
SET state = 'in_progress', fingerprint = $4,
    response_status = NULL, response_content_type = NULL, response_body = NULL, response_ref = NULL,
    correlation_id = $5, trace_parent = NULLIF($7, ''), created_at = now(), expires_at = now() + $6 * interval '1 millisecond'
WHERE principal_id = $1 AND endpoint = $2 AND key = $3 AND expires_at < now()
RETURNING created_at`

// takeOver claims principal's expired row s. It reports whether this
// transaction now owns the key, and the transaction's now(); false means
// there was no expired row to take (any more).
func takeOver(ctx context.Context, tx pgx.Tx, principal uuid.UUID, s Scope, fingerprint []byte, requestID, traceParent string, ttl time.Duration) (bool, time.Time, error) {
	var now time.Time
	err := tx.QueryRow(ctx, takeOverSQL, principal, s.Endpoint, s.Key, fingerprint, requestID, ttl.Milliseconds(), traceParent).Scan(&now)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, err
	}
	return true, now, nil
}

// complete is the statement that stores the outcome on the claimed row, in
// the claiming transaction: either the body or, when it is over the cap,
// ref. It goes last in the round trip that carries the operation's own
// writes, so they and the response reach the server together.
func complete(principal uuid.UUID, s Scope, state State, resp Response, ref string) database.Statement {
	body, refArg := resp.Body, &ref
	if ref == "" {
		refArg = nil
	} else {
		body = nil
	}
	return database.Statement{SQL: `
		UPDATE idempotency_keys
		SET state = $4, response_status = $5, response_content_type = $6, response_body = $7, response_ref = $8
		WHERE principal_id = $1 AND endpoint = $2 AND key = $3 AND state = 'in_progress'`,
		Args: []any{principal, s.Endpoint, s.Key, string(state), resp.Status, resp.ContentType, body, refArg}, Done: func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("store response: claimed row not found in state in_progress (updated %d rows)", tag.RowsAffected())
			}
			return nil
		}}
}
