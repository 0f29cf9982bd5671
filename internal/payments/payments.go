// Package payments owns the payments table: validating a new payment,
// recording it with the job that will charge it, charging it through the
// processor (ChargeWorker), reading it back, and recording what has been
// refunded.
//
// A payment is created `processing` in the request's transaction, together
// with an outbox job; the job charges the processor with the client's intent
// (Payment.ProcessorKey, not the payment's id, which a lost commit takes with
// it) as the processor's idempotency key and records `succeeded` or `failed`
// in one transaction with the job's completion.
package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/keyset"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// Limits on what a client may send.
const (
	// MaxAmount is the largest amount, in minor units, of a payment or a
	// refund (10^12 - 1): payment-sized, and exact in every JSON client
	// (JavaScript's numbers are exact only up to 2^53 - 1; an int64 near
	// its maximum would be read as a different number).
	MaxAmount            = 999_999_999_999
	MaxDescriptionLength = 1000
	MaxMetadataKeys      = 20
	MaxMetadataKeyLength = 40
	MaxMetadataValue     = 500
)

// MaxProcessorTextLength bounds what a processor's answer leaves in a row
// (failure_reason, processor_id), as the columns' checks do.
const MaxProcessorTextLength = 100

// A payment's statuses: processing until the processor has answered, then
// succeeded or failed (with a reason). requires_reconciliation is a payment
// whose charge got no definite answer within the retry budget: the processor
// may or may not have charged it, and the reconciler settles it from the
// processor's record. It is never guessed as failed.
const (
	StatusProcessing             = "processing"
	StatusSucceeded              = "succeeded"
	StatusFailed                 = "failed"
	StatusRequiresReconciliation = "requires_reconciliation"
)

// ErrNotFound means no payment with that id is visible to the principal.
var ErrNotFound = errors.New("payment not found")

// Payment is a recorded payment as clients see it.
type Payment struct {
	ID             uuid.UUID         `json:"id"`
	Amount         int64             `json:"amount"`
	AmountRefunded int64             `json:"amount_refunded"`
	Currency       string            `json:"currency"`
	Status         string            `json:"status"`
	FailureReason  *string           `json:"failure_reason"`
	Description    *string           `json:"description"`
	Metadata       map[string]string `json:"metadata"`
	// Livemode is false for a payment charged through the simulator: no
	// money moved. It never changes.
	Livemode  bool      `json:"livemode"`
	CreatedAt time.Time `json:"created_at"`
	// ProcessorKey is the charge's idempotency key at the processor (the
	// client's intent, CreateParams.ProcessorKey); never shown to clients.
	ProcessorKey string `json:"-"`
	// ProcessorID is the processor's own id of the charge, once it made it
	// (empty before); a refund names its charge by it (processor.Refund).
	ProcessorID string `json:"-"`
}

// Refundable returns what can still be refunded.
func (p Payment) Refundable() int64 { return p.Amount - p.AmountRefunded }

// NewPayment is a request to create a payment. Amount is in minor units
// (cents for usd); Currency is an ISO 4217 code in either case.
type NewPayment struct {
	Amount      *int64            `json:"amount"`
	Currency    string            `json:"currency"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
}

// noNUL is the message for text with U+0000, which PostgreSQL's text and
// jsonb cannot store: refused as invalid input instead of failing as a 500
// when the database rejects it.
const noNUL = "must not contain the character U+0000"

// Validate checks every field and reports all problems at once.
func (n NewPayment) Validate() error {
	var c validation.Collector
	switch {
	case n.Amount == nil:
		c.Add("amount", "is required")
	case *n.Amount <= 0 || *n.Amount > MaxAmount:
		c.Add("amount", fmt.Sprintf("must be a whole number of minor units from 1 to %d", MaxAmount))
	}
	if n.Currency == "" {
		c.Add("currency", "is required")
	} else if !IsCurrency(n.Currency) {
		c.Add("currency", "must be an active ISO 4217 currency code, in lower or upper case")
	}
	if n.Description != nil {
		switch {
		case utf8.RuneCountInString(*n.Description) > MaxDescriptionLength:
			c.Add("description", fmt.Sprintf("must be at most %d characters", MaxDescriptionLength))
		case strings.ContainsRune(*n.Description, 0):
			c.Add("description", noNUL)
		}
	}
	if len(n.Metadata) > MaxMetadataKeys {
		c.Add("metadata", fmt.Sprintf("must have at most %d keys", MaxMetadataKeys))
	}
	for k, v := range n.Metadata {
		if k == "" || utf8.RuneCountInString(k) > MaxMetadataKeyLength || strings.ContainsRune(k, 0) {
			c.Add("metadata", fmt.Sprintf("keys must be 1-%d characters, without U+0000", MaxMetadataKeyLength))
			break
		}
		switch {
		case utf8.RuneCountInString(v) > MaxMetadataValue:
			c.Add("metadata."+k, fmt.Sprintf("must be at most %d characters", MaxMetadataValue))
		case strings.ContainsRune(v, 0):
			c.Add("metadata."+k, noNUL)
		}
	}
	return c.Err()
}

// Origin is the request that creates a payment or a refund: its request id
// (X-Request-Id) and its Idempotency-Key, kept on the row for the events
// that name it.
type Origin struct{ RequestID, IdempotencyKey string }

// Announcer gives the statements that record a settle's event and what
// follows from it (webhook deliveries), to send after the settle's own:
// events.Announcer. The settle marks its row with the event's id, and the
// event is recorded if and only if the settle changed the row. Payments and
// refunds hand their settles to it and know nothing of events, so that a
// service without them passes nil (docs/fork.md).
type Announcer interface {
	Announce(ctx context.Context, s Settled) ([]database.Statement, error)
}

// Settled is a settle to announce: Principal's row ID of Table (payments or
// refunds), now of event type Type ("payment.succeeded"), marked with
// EventID; Object is the row as the event shows it.
type Settled struct {
	Table                  string
	Principal, ID, EventID uuid.UUID
	Type                   string
	Object                 any
}

// CreateParams is a payment to create.
type CreateParams struct {
	Principal uuid.UUID
	// Origin is the request that creates it, named by its events.
	Origin Origin
	// New is the client's validated request.
	New NewPayment
	// Live says whether the processor that will charge it moves real money
	// (Payment.Livemode).
	Live bool
	// Now is the request transaction's now(), the payment's created_at.
	Now time.Time
	// ProcessorKey is the charge's idempotency key at the processor: the
	// client's intent (idempotency.Work.Intent), not the payment's id,
	// which a lost commit takes with it (docs/external-effects.md).
	ProcessorKey string
}

// Create returns a validated payment and the statements that record it with
// the job that will charge it, to send in the request's transaction: they
// commit with it or neither does.
func Create(ctx context.Context, jobs outbox.Enqueuer, c CreateParams) (Payment, []database.Statement, error) {
	n, principal, req := c.New, c.Principal, c.Origin
	p := Payment{
		Livemode:     c.Live,
		ID:           uuid.Must(uuid.NewV7()), // time-ordered: new rows land at the right edge of the primary key index
		Amount:       *n.Amount,
		Currency:     strings.ToLower(n.Currency),
		Status:       StatusProcessing,
		Description:  n.Description,
		Metadata:     n.Metadata,
		CreatedAt:    c.Now,
		ProcessorKey: c.ProcessorKey,
	}
	if p.Metadata == nil {
		p.Metadata = map[string]string{}
	}
	insert := database.Statement{SQL: `
		INSERT INTO payments (id, principal_id, amount, currency, status, description, metadata, livemode, created_at, request_id, idempotency_key, processor_key)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		Args: []any{p.ID, principal, p.Amount, p.Currency, p.Status, p.Description, p.Metadata, p.Livemode, p.CreatedAt, req.RequestID, req.IdempotencyKey, p.ProcessorKey}}
	charge, err := jobs.Enqueue(ctx, principal, ChargeArgs{PaymentID: p.ID, Principal: principal})
	if err != nil {
		return Payment{}, nil, fmt.Errorf("enqueue charge: %w", err)
	}
	return p, []database.Statement{insert, charge}, nil
}

// Get returns principal's payment with id. Row-level security hides other
// principals' payments, which therefore look exactly like missing ones.
//
// Every statement on a tenant table names the principal, as its first
// parameter, beside whatever else it looks up: with the tables distributed
// by principal, that is what routes it to one shard (docs/scaling.md).
func Get(ctx context.Context, db database.DBTX, principal, id uuid.UUID) (Payment, error) {
	return get(ctx, db, principal, id, "")
}

// GetForUpdate returns principal's payment with id and locks its row until
// tx ends. Every refund of a payment takes this lock first, so refunds of
// one payment run one after another and each sees what the previous ones
// refunded.
func GetForUpdate(ctx context.Context, tx pgx.Tx, principal, id uuid.UUID) (Payment, error) {
	return get(ctx, tx, principal, id, " FOR UPDATE")
}

// columns are what scanOne reads, in its order.
const columns = `id, amount, amount_refunded, currency, status, failure_reason, description, metadata, livemode, created_at, processor_key, coalesce(processor_id, '')`

const getSQL = `SELECT ` + columns + ` FROM payments WHERE principal_id = $1 AND id = $2`

func get(ctx context.Context, db database.DBTX, principal, id uuid.UUID, lock string) (Payment, error) {
	return scanOne(db.QueryRow(ctx, getSQL+lock, principal, id))
}

// Load is Get as a statement: *p is the payment once it has run, and it
// fails with ErrNotFound when there is none.
func Load(principal, id uuid.UUID, p *Payment) database.Statement {
	return database.Statement{SQL: getSQL, Args: []any{principal, id}, Row: func(row pgx.Row) (err error) {
		*p, err = scanOne(row)
		return err
	}}
}

func scanOne(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.ID, &p.Amount, &p.AmountRefunded, &p.Currency, &p.Status, &p.FailureReason, &p.Description, &p.Metadata, &p.Livemode, &p.CreatedAt, &p.ProcessorKey, &p.ProcessorID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("get payment: %w", err)
	}
	return p, nil
}

// ListLimit is the most payments one list response holds.
const ListLimit = 100

// List returns up to limit of principal's payments, after the payment with
// id after when it is not nil, and whether there are more.
//
// The order is final when a payment becomes visible (migration 13): by the
// creating transaction's id, showing only payments whose transaction is
// older than every one still running. A payment committing late cannot land
// behind a page already read, so a client following the cursor sees each
// payment exactly once; the newest payments show once the transactions
// begun before them have ended, milliseconds later.
func List(ctx context.Context, db database.DBTX, principal uuid.UUID, after *uuid.UUID, limit int) ([]Payment, bool, error) {
	rows, err := db.Query(ctx, `SELECT `+columns+`
		FROM payments
		WHERE principal_id = $1
		  AND xid < (SELECT list_horizon())
		  AND ($2::uuid IS NULL OR (xid, id) > (SELECT c.xid, c.id FROM payments c WHERE c.principal_id = $1 AND c.id = $2))
		ORDER BY xid, id LIMIT $3`, principal, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list payments: %w", err)
	}
	return keyset.Page(rows, limit, scanOne, after, func(id uuid.UUID) (bool, error) {
		_, err := Get(ctx, db, principal, id)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	})
}

// SettleParams is a processor's answer for one payment not yet decided.
type SettleParams struct {
	Principal uuid.UUID
	// Payment is the payment as read: with the answer, the event's snapshot
	// (nothing else of an undecided payment changes: it cannot be refunded
	// yet).
	Payment     Payment
	Status      string
	Reason      *string
	ProcessorID string
}

// Settle returns the statements that record s: the payment's decided
// status, then announcer's for it (its event; nil: none). Once they have
// run, *changed says whether they changed the row: false when the payment
// was already decided, by an earlier run of its job or by the reconciler,
// whose answer (and event) stands. The outbox worker sends them with its
// job's completion, the reconciler on their own: one round trip either way.
func Settle(ctx context.Context, announcer Announcer, s SettleParams) (stmts []database.Statement, changed *bool, err error) {
	p := s.Payment
	p.Status, p.FailureReason = s.Status, s.Reason
	processorID := database.StorableText(s.ProcessorID, MaxProcessorTextLength)
	changed = new(bool)
	eventID := uuid.Must(uuid.NewV7())
	stmts = []database.Statement{{SQL: settleSQL, Args: []any{s.Principal, p.ID, s.Status, s.Reason, processorID, eventID}, Done: func(tag pgconn.CommandTag) error {
		*changed = tag.RowsAffected() == 1
		return nil
	}}}
	if announcer == nil {
		return stmts, changed, nil
	}
	announced, err := announcer.Announce(ctx, Settled{Table: "payments", Principal: s.Principal, ID: p.ID, EventID: eventID, Type: "payment." + s.Status, Object: p})
	return append(stmts, announced...), changed, err
}

// settleSQL moves the payment to its decided status, marking it with the id
// of the event that will say so (the Announcer's, sent next): the
// event exists if and only if this statement changed the row.
const settleSQL = `
	UPDATE payments SET status = $3, failure_reason = $4, processor_id = NULLIF($5, ''), settle_event_id = $6
	WHERE principal_id = $1 AND id = $2 AND status IN ('processing', 'requires_reconciliation') AND status <> $3`

// addRefundedSQL adds $3 to what principal $1's payment $2 has refunded.
// The table's CHECK refuses a total above the payment's amount or below
// zero.
const addRefundedSQL = `UPDATE payments SET amount_refunded = amount_refunded + $3 WHERE principal_id = $1 AND id = $2`

// AddRefunded is the statement that records amount more as refunded on
// principal's payment id. It fails with ErrNotFound when there is no such
// payment.
func AddRefunded(principal, id uuid.UUID, amount int64) database.Statement {
	return database.Statement{SQL: addRefundedSQL, Args: []any{principal, id, amount}, Done: func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return ErrNotFound
		}
		return nil
	}}
}
