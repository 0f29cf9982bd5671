// Package receiver is an example webhook receiver that applies each event
// exactly once, however many times it is delivered: it records the event's
// id in its own table in the same transaction as the event's effect, the
// pattern the payments service uses for its own requests. The effect here
// is a row in `effects`, standing in for whatever a real receiver does
// (mark an order paid, email a receipt from a mail outbox, ...).
package receiver

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/client"
)

// Schema creates the receiver's tables.
const Schema = `
CREATE TABLE IF NOT EXISTS received_webhooks (
    webhook_id  uuid        PRIMARY KEY, -- the event's id: the dedup key
    type        text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS effects (
    id          bigserial   PRIMARY KEY, -- no unique key of its own: only received_webhooks keeps it to one per event
    webhook_id  uuid        NOT NULL,
    type        text        NOT NULL,
    object_id   uuid        NOT NULL,
    status      text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);`

// Receiver applies events to its database.
type Receiver struct {
	Pool *pgxpool.Pool
	// OnApply, when set, hears each event applied (not the repeats).
	OnApply func(e client.Event)
}

// Apply applies e once: the insert of its id and the effect commit
// together, and a second delivery of the same id finds it and does
// nothing. Two deliveries at once: the second's insert waits for the
// first's transaction, then finds the id.
func (r *Receiver) Apply(ctx context.Context, e client.Event) error {
	applied := false
	err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO received_webhooks (webhook_id, type) VALUES ($1, $2) ON CONFLICT DO NOTHING`, e.Id, e.Type)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // applied by an earlier delivery
		}
		var object struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		raw, err := e.Data.Object.MarshalJSON()
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &object); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (webhook_id, type, object_id, status) VALUES ($1, $2, $3, $4)`,
			e.Id, e.Type, object.ID, object.Status); err != nil {
			return err
		}
		applied = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply event %s: %w", e.Id, err)
	}
	if applied && r.OnApply != nil {
		r.OnApply(e)
	}
	return nil
}
