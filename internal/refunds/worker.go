package refunds

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/riverqueue/river"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/processor"
)

// Args is the outbox job that sends one refund to the processor.
type Args struct {
	RefundID  uuid.UUID `json:"refund_id"`
	PaymentID uuid.UUID `json:"payment_id"`
	Principal uuid.UUID `json:"principal_id"`
}

// Kind names the job in River's table.
func (Args) Kind() string { return "refund_payment" }

// Worker sends a pending refund to the processor, keyed by the client's
// intent (Refund.ProcessorKey) and naming its charge by the payment's key,
// and records the answer with the job's completion (outbox.Perform), as
// payments.ChargeWorker does for charges; Settle gives a failed refund's
// amount back.
type Worker struct {
	river.WorkerDefaults[Args]
	Pool      *database.Pool
	Processor processor.Processor
	// Announcer records each decided refund's event (nil: none).
	Announcer payments.Announcer
}

// Work runs one attempt.
func (w *Worker) Work(ctx context.Context, job *river.Job[Args]) error {
	return outbox.Perform(ctx, w.Pool, job.Args.Principal, job, outbox.Effect[Refund]{
		Load:    func(r *Refund) database.Statement { return Load(job.Args.Principal, job.Args.RefundID, r) },
		Pending: func(r Refund) bool { return r.Status == StatusPending },
		Call: func(ctx context.Context, r Refund, last bool) ([]database.Statement, error) {
			res, err := w.Processor.Refund(ctx, processor.Refund{Key: r.ProcessorKey, ChargeKey: r.ChargeKey, ChargeID: r.ChargeID, Amount: r.Amount, Currency: r.Currency, Reference: r.ID.String()})
			// The decided statuses are the same words for refunds and
			// payments (succeeded, failed, requires_reconciliation).
			status, reason := payments.Decision(err, last)
			if status == "" {
				return nil, fmt.Errorf("refund %s: %w", r.ID, err)
			}
			record, _, err := Settle(ctx, w.Announcer, SettleParams{Principal: job.Args.Principal, Refund: r, Status: status, Reason: reason, ProcessorID: res.ID})
			return record, err
		},
	})
}
