// Package events owns the events table: the record of every status change of
// a payment or a refund, with a snapshot of the object as it became, read by
// GET /v1/events and pushed to webhook endpoints (package webhooks).
//
// An event is written in the transaction and round trip of the statement
// that makes the change it describes (payments.settleSQL, refunds.settleSQL),
// whose settle hands it to Announcer, and only where that statement changed
// the row: a change that commits has its event, one that rolls back has
// none, and a change made twice (a rescued job, the reconciler after a
// worker) is made, and recorded, once. Payments and refunds know no more of events than their
// Announcer interface, so that a service can do without them (docs/fork.md).
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/keyset"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// Retention is how long an event is kept, and listable: the promise
// openapi.yaml and docs/webhooks.md publish, and migration 14's guard on the
// maintenance role's deletes.
const Retention = 30 * 24 * time.Hour

// ListLimit is the most events one list response holds.
const ListLimit = 100

// ErrNotFound means no event with that id is visible to the principal.
var ErrNotFound = errors.New("event not found")

// Event is a recorded event as clients see it, in GET /v1/events and as a
// webhook's body.
type Event struct {
	ID   uuid.UUID `json:"id"`
	Type string    `json:"type"`
	// Data is {"object": ...}: the payment or refund as it became.
	Data json.RawMessage `json:"data"`
	// Request names the request that created the object.
	Request  Request   `json:"request"`
	Livemode bool      `json:"livemode"`
	Created  time.Time `json:"created_at"`
}

// Request is the request that created an event's object: its request id
// (X-Request-Id of the attempt that executed) and its Idempotency-Key. Both
// are null for objects made before they were recorded.
type Request struct {
	ID             *string `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

// Data renders an object as an event's data.
func Data(object any) ([]byte, error) {
	raw, err := json.Marshal(struct {
		Object any `json:"object"`
	}{object})
	if err != nil {
		return nil, fmt.Errorf("render event data: %w", err)
	}
	return raw, nil
}

const columns = `id, type, data, request_id, idempotency_key, livemode, created_at`

func scan(row pgx.Row) (Event, error) {
	var e Event
	err := row.Scan(&e.ID, &e.Type, &e.Data, &e.Request.ID, &e.Request.IdempotencyKey, &e.Livemode, &e.Created)
	return e, err
}

// Get returns principal's event with id; other principals' events are
// invisible.
func Get(ctx context.Context, db database.DBTX, principal, id uuid.UUID) (Event, error) {
	e, err := scan(db.QueryRow(ctx, `SELECT `+columns+` FROM events WHERE principal_id = $1 AND id = $2`, principal, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Event{}, ErrNotFound
	}
	if err != nil {
		return Event{}, fmt.Errorf("get event: %w", err)
	}
	return e, nil
}

// Load is Get as a statement: *e is the event once it has run, and it fails
// with ErrNotFound when there is none.
func Load(principal, id uuid.UUID, e *Event) database.Statement {
	return database.Statement{SQL: `SELECT ` + columns + ` FROM events WHERE principal_id = $1 AND id = $2`, Args: []any{principal, id}, Row: func(row pgx.Row) (err error) {
		*e, err = scan(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		return err
	}}
}

// List returns up to limit of principal's events, after the event with
// id after when it is not nil, and whether there are more. The order is
// final when an event becomes visible, as payments.List's: by the creating
// transaction's id, showing only events whose transaction is older than
// every one still running. A client that follows the cursor sees every
// event once, in the order the changes committed.
func List(ctx context.Context, db database.DBTX, principal uuid.UUID, after *uuid.UUID, limit int) ([]Event, bool, error) {
	rows, err := db.Query(ctx, `
		SELECT `+columns+` FROM events
		WHERE principal_id = $1
		  AND xid < (SELECT list_horizon())
		  AND ($2::uuid IS NULL OR (xid, id) > (SELECT c.xid, c.id FROM events c WHERE c.principal_id = $1 AND c.id = $2))
		ORDER BY xid, id LIMIT $3`, principal, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list events: %w", err)
	}
	return keyset.Page(rows, limit, scan, after, func(id uuid.UUID) (bool, error) {
		_, err := Get(ctx, db, principal, id)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	})
}

// settledSQL is the statement that records the event of a settle of
// principal $1's row $2 of table (payments or refunds): event $3, of type
// $4, with data $5. The settle's UPDATE, sent before it, marked
// the row with the event's id (settle_event_id, migration 20) if and only
// if it changed it, so the event is inserted if and only if that UPDATE
// changed the row. The event's principal is the row's own column, so that
// Citus runs the INSERT ... SELECT on the row's shard (an INSERT given it as
// a parameter is planned through the coordinator, which row-level security
// refuses: docs/scaling.md).
func settledSQL(table string) string {
	return `
	INSERT INTO events (id, principal_id, type, data, request_id, idempotency_key, livemode)
	SELECT $3, principal_id, $4, $5, request_id, idempotency_key, livemode
	FROM ` + table + ` WHERE principal_id = $1 AND id = $2 AND settle_event_id = $3`
}

// Announcer records the events of payments' and refunds' settles
// (payments.Announcer): the statement that records the event, and Fanout's
// for it. A nil Fanout adds nothing more.
type Announcer struct{ Fanout Fanout }

// Announce implements payments.Announcer.
func (a Announcer) Announce(ctx context.Context, s payments.Settled) ([]database.Statement, error) {
	data, err := Data(s.Object)
	if err != nil {
		return nil, err
	}
	event := database.Statement{SQL: settledSQL(s.Table), Args: []any{s.Principal, s.ID, s.EventID, s.Type, data}}
	if a.Fanout == nil {
		return []database.Statement{event}, nil
	}
	then, err := a.Fanout.FanOut(ctx, s.Principal, s.EventID)
	return append([]database.Statement{event}, then...), err
}

// Fanout gives the statements of what must happen because of an event,
// sent after the statement that may insert it, in the same transaction:
// webhooks.Fanout inserts one delivery job per endpoint. They must do
// nothing when that statement inserted no event (the change was already
// made). ctx carries the trace the deliveries continue.
type Fanout interface {
	FanOut(ctx context.Context, principal, eventID uuid.UUID) ([]database.Statement, error)
}

// sweepChunkSQL deletes at most $2 of principal $1's events older than the
// retention, oldest first, through the (principal_id, created_at) index:
// one principal at a time, as the key sweeper works, so that each statement
// stays on one shard. Events are never updated, so nothing can revive a row
// between the pick and the delete; the maintenance role's policy refuses a
// younger row anyway.
const sweepChunkSQL = `
	DELETE FROM events WHERE principal_id = $1 AND id IN (
		SELECT id FROM events WHERE principal_id = $1 AND created_at < now() - $3::interval
		ORDER BY created_at LIMIT $2)`

// Sweep deletes the events older than Retention in chunks of chunk rows,
// pausing between them, and returns how many it deleted. pool connects as
// the maintenance role. Their delivery attempts go with them.
func Sweep(ctx context.Context, pool *database.Pool, chunk int, pause time.Duration) (int64, error) {
	var total int64
	err := pool.WithConn(ctx, func(c database.DBTX) error {
		return database.EachPrincipal(ctx, c, func(principal uuid.UUID) error {
			for {
				tag, err := c.Exec(ctx, sweepChunkSQL, principal, chunk, Retention)
				if err != nil {
					return err
				}
				total += tag.RowsAffected()
				if tag.RowsAffected() < int64(chunk) {
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(pause):
				}
			}
		})
	})
	if err != nil {
		return total, fmt.Errorf("sweep events: %w", err)
	}
	return total, nil
}
