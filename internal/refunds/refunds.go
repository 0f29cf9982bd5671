// Package refunds owns the refunds table: the rule that refunds never exceed
// what remains of a payment, recording a refund with the job that will send
// it to the processor (RefundWorker), and reading refunds back.
//
// A refund is recorded `pending`, and its amount is counted as refunded on
// the payment at once, so pending refunds count against what remains; a
// refund the processor refuses gives its amount back.
//
// The one import of another domain package: a refund locks its payment's row
// and adds to its amount_refunded in the refund's own transaction
// (payments.GetForUpdate, payments.AddRefunded), because "refunds never
// exceed the payment" is a rule across both tables that only one
// transaction can keep. payments knows nothing of refunds.
package refunds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/keyset"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// Reasons a client may give.
var Reasons = []string{"requested_by_customer", "duplicate", "fraudulent"}

// A refund's statuses: pending until the processor has answered, then
// succeeded or failed (with a reason). requires_reconciliation is a refund
// whose outcome stayed unknown to the end of its retry budget; its amount
// stays counted against the payment until the reconciler settles it.
const (
	StatusPending                = "pending"
	StatusSucceeded              = "succeeded"
	StatusFailed                 = "failed"
	StatusRequiresReconciliation = "requires_reconciliation"
)

// ListLimit is the most refunds one list response holds.
const ListLimit = 100

// ErrNotFound means no refund with that id is visible to the principal.
var ErrNotFound = errors.New("refund not found")

// ErrPaymentProcessing means the payment's charge is not decided yet (it is
// processing, or waiting for reconciliation): it cannot be refunded now, but
// may be later. Nothing was recorded.
var ErrPaymentProcessing = errors.New("payment is still processing")

// ErrPaymentFailed is the business rejection of a refund of a payment that
// failed: there is nothing to give back. Like ExceedsError, it is an outcome.
var ErrPaymentFailed = errors.New("payment failed; nothing to refund")

// ExceedsError is the business rejection of a refund larger than what remains
// of the payment. It happens after execution began (the payment was locked
// and read), so it is an outcome: stored and replayed like a success.
type ExceedsError struct {
	Requested int64
	Remaining int64
}

func (e *ExceedsError) Error() string {
	return fmt.Sprintf("refund of %d exceeds the %d that remains refundable", e.Requested, e.Remaining)
}

// Refund is a recorded refund as clients see it.
type Refund struct {
	ID        uuid.UUID `json:"id"`
	PaymentID uuid.UUID `json:"payment_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Reason    *string   `json:"reason"`
	Status    string    `json:"status"`
	// FailureReason says why a failed refund failed; null otherwise.
	FailureReason *string `json:"failure_reason"`
	// Livemode is the payment's: false when no money moves.
	Livemode  bool      `json:"livemode"`
	CreatedAt time.Time `json:"created_at"`
	// ProcessorKey is the refund's idempotency key at the processor (the
	// client's intent); ChargeKey its payment's, the charge it gives back,
	// and ChargeID the processor's id of that charge. None is shown to
	// clients.
	ProcessorKey string `json:"-"`
	ChargeKey    string `json:"-"`
	ChargeID     string `json:"-"`
}

// NewRefund is a request to refund a payment. Amount nil means everything
// that remains refundable.
type NewRefund struct {
	Amount *int64  `json:"amount"`
	Reason *string `json:"reason"`
}

// RequestParams is a refund to request.
type RequestParams struct {
	Principal uuid.UUID
	// Origin is the request that makes the refund, named by its events.
	Origin    payments.Origin
	PaymentID uuid.UUID
	New       NewRefund
	// Now is the request transaction's now(), the refund's created_at.
	Now time.Time
	// ProcessorKey is the refund's idempotency key at the processor: the
	// client's intent (idempotency.Work.Intent).
	ProcessorKey string
}

// Validate checks the fields that can be checked without the payment.
func (n NewRefund) Validate() error {
	var c validation.Collector
	if n.Amount != nil && (*n.Amount <= 0 || *n.Amount > payments.MaxAmount) {
		c.Add("amount", fmt.Sprintf("must be a whole number of minor units from 1 to %d", payments.MaxAmount))
	}
	if n.Reason != nil && !slices.Contains(Reasons, *n.Reason) {
		c.Add("reason", "must be one of requested_by_customer, duplicate, fraudulent")
	}
	return c.Err()
}

// Request makes a refund of the payment paymentID, with the job that will
// send it to the processor: it reads and locks the payment in tx, and
// returns the refund and the statements that record it, to send in tx. It
// locks the payment first: refunds of one payment run one after another,
// and each sees what the previous ones, pending included, took. It returns *ExceedsError when the amount (by default, all
// that remains) is more than remains, ErrPaymentFailed or ErrPaymentProcessing
// for a payment that cannot be refunded (now), and payments.ErrNotFound.
// c.Origin is the request that makes the refund, named by its events.
func Request(ctx context.Context, tx pgx.Tx, jobs outbox.Enqueuer, c RequestParams) (Refund, []database.Statement, error) {
	principal, req, paymentID, n, now := c.Principal, c.Origin, c.PaymentID, c.New, c.Now
	p, err := payments.GetForUpdate(ctx, tx, principal, paymentID)
	if err != nil {
		return Refund{}, nil, err
	}
	switch p.Status {
	case payments.StatusProcessing, payments.StatusRequiresReconciliation:
		return Refund{}, nil, ErrPaymentProcessing
	case payments.StatusFailed:
		return Refund{}, nil, ErrPaymentFailed
	}
	amount := p.Refundable()
	if n.Amount != nil {
		amount = *n.Amount
	}
	if amount > p.Refundable() || amount <= 0 {
		return Refund{}, nil, &ExceedsError{Requested: amount, Remaining: p.Refundable()}
	}
	r := Refund{
		ID:        uuid.Must(uuid.NewV7()),
		PaymentID: p.ID,
		Amount:    amount,
		Currency:  p.Currency,
		Reason:    n.Reason,
		Status:    StatusPending,
		Livemode:  p.Livemode,
		CreatedAt: now,
		// Keyed by the client's intent, as a charge is; it gives back the
		// charge made with the payment's key.
		ProcessorKey: c.ProcessorKey,
		ChargeKey:    p.ProcessorKey,
		ChargeID:     p.ProcessorID,
	}
	// Checked under the payment's lock, the writes need nothing more from
	// the database: they travel in one round trip, with the response.
	insert := database.Statement{SQL: `
		INSERT INTO refunds (id, principal_id, payment_id, amount, currency, reason, status, livemode, created_at, request_id, idempotency_key, processor_key, charge_key, charge_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		Args: []any{r.ID, principal, r.PaymentID, r.Amount, r.Currency, r.Reason, r.Status, r.Livemode, r.CreatedAt, req.RequestID, req.IdempotencyKey, r.ProcessorKey, r.ChargeKey, r.ChargeID}}
	job, err := jobs.Enqueue(ctx, principal, Args{RefundID: r.ID, PaymentID: p.ID, Principal: principal})
	if err != nil {
		return Refund{}, nil, fmt.Errorf("enqueue refund: %w", err)
	}
	return r, []database.Statement{insert, payments.AddRefunded(principal, p.ID, r.Amount), job}, nil
}

// SettleParams is a processor's answer for one refund not yet decided.
type SettleParams struct {
	Principal uuid.UUID
	// Refund is the refund as read: with the answer, the event's snapshot
	// (nothing else of a refund changes).
	Refund      Refund
	Status      string
	Reason      *string
	ProcessorID string
}

// Settle returns the statements that record s: the refund's decided
// status, then announcer's for it (its event; nil: none). A refund
// that failed gives its amount back to the payment, once: only the
// statement that moves it to failed does. A refund waiting for
// reconciliation keeps its amount counted, since the money may have moved.
// Once they have run, *changed says whether the row changed.
func Settle(ctx context.Context, announcer payments.Announcer, s SettleParams) (stmts []database.Statement, changed *bool, err error) {
	r := s.Refund
	r.Status, r.FailureReason = s.Status, s.Reason
	processorID := database.StorableText(s.ProcessorID, payments.MaxProcessorTextLength)
	changed = new(bool)
	eventID := uuid.Must(uuid.NewV7())
	stmts = []database.Statement{
		{SQL: settleSQL, Args: []any{s.Principal, r.ID, s.Status, s.Reason, processorID, eventID}, Done: func(tag pgconn.CommandTag) error {
			*changed = tag.RowsAffected() == 1
			return nil
		}},
		{SQL: givenBackSQL, Args: []any{s.Principal, r.ID, eventID}},
	}
	if announcer == nil {
		return stmts, changed, nil
	}
	announced, err := announcer.Announce(ctx, payments.Settled{Table: "refunds", Principal: s.Principal, ID: r.ID, EventID: eventID, Type: "refund." + s.Status, Object: r})
	return append(stmts, announced...), changed, err
}

// settleSQL moves the refund, marking it with the id of the event that will
// say so; givenBackSQL and the Announcer's event, sent next in the same
// transaction, act only on a refund carrying that id, so none of the three
// happens without the others. Each names the principal, $1, so that all
// three stay on its shard.
const settleSQL = `
	UPDATE refunds SET status = $3, failure_reason = $4, processor_id = NULLIF($5, ''), settle_event_id = $6
	WHERE principal_id = $1 AND id = $2 AND status IN ('pending', 'requires_reconciliation') AND status <> $3`

// givenBackSQL gives a refund's amount back to its payment when the settle
// that carries event $3 moved it to failed.
const givenBackSQL = `
	UPDATE payments p SET amount_refunded = p.amount_refunded - r.amount
	FROM refunds r
	WHERE p.principal_id = $1 AND r.principal_id = $1 AND r.id = $2 AND r.settle_event_id = $3
	  AND r.status = 'failed' AND p.id = r.payment_id`

// Load is Get as a statement: *r is the refund once it has run, and it
// fails with ErrNotFound when there is none.
func Load(principal, id uuid.UUID, r *Refund) database.Statement {
	return database.Statement{SQL: getSQL, Args: []any{principal, id}, Row: func(row pgx.Row) (err error) {
		*r, err = scan(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		return err
	}}
}

const columns = `id, payment_id, amount, currency, reason, status, failure_reason, livemode, created_at, processor_key, charge_key, charge_id`

func scan(row pgx.Row) (Refund, error) {
	var r Refund
	err := row.Scan(&r.ID, &r.PaymentID, &r.Amount, &r.Currency, &r.Reason, &r.Status, &r.FailureReason, &r.Livemode, &r.CreatedAt, &r.ProcessorKey, &r.ChargeKey, &r.ChargeID)
	return r, err
}

const getSQL = `SELECT ` + columns + ` FROM refunds WHERE principal_id = $1 AND id = $2`

// Get returns principal's refund with id; other principals' refunds are
// invisible.
func Get(ctx context.Context, db database.DBTX, principal, id uuid.UUID) (Refund, error) {
	r, err := scan(db.QueryRow(ctx, getSQL, principal, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, ErrNotFound
	}
	if err != nil {
		return Refund{}, fmt.Errorf("get refund: %w", err)
	}
	return r, nil
}

// List returns up to limit refunds of principal's payment paymentID, after the refund with id
// after when it is not nil, and whether there are more, in an order final
// when a refund becomes visible, as payments.List's.
func List(ctx context.Context, db database.DBTX, principal, paymentID uuid.UUID, after *uuid.UUID, limit int) ([]Refund, bool, error) {
	rows, err := db.Query(ctx, `
		SELECT `+columns+` FROM refunds
		WHERE principal_id = $1 AND payment_id = $2
		  AND xid < (SELECT list_horizon())
		  AND ($3::uuid IS NULL OR (xid, id) > (SELECT c.xid, c.id FROM refunds c WHERE c.principal_id = $1 AND c.id = $3 AND c.payment_id = $2))
		ORDER BY xid, id LIMIT $4`,
		principal, paymentID, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list refunds: %w", err)
	}
	return keyset.Page(rows, limit, scan, after, func(id uuid.UUID) (bool, error) {
		r, err := Get(ctx, db, principal, id)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		return err == nil && r.PaymentID == paymentID, err
	})
}
