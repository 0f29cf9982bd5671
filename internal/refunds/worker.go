package refunds

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

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

// Worker sends a pending refund to the processor, keyed by the refund's id,
// and records the answer with the job's completion in one transaction, as
// payments.ChargeWorker does for charges (see Settle).
type Worker struct {
	river.WorkerDefaults[Args]
	Pool      *database.Pool
	Processor processor.Processor
}

// Work runs one attempt.
func (w *Worker) Work(ctx context.Context, job *river.Job[Args]) error {
	var r Refund
	err := database.InTenantTx(ctx, w.Pool, job.Args.Principal, database.TxOptions{ReadOnly: true}, func(tx pgx.Tx) (err error) {
		r, err = Get(ctx, tx, job.Args.RefundID)
		return err
	})
	if err != nil {
		return fmt.Errorf("refund %s: %w", job.Args.RefundID, err)
	}
	if r.Status != StatusPending {
		return nil // a run that died after recording the answer, rescued
	}
	res, err := w.Processor.Refund(ctx, processor.Refund{Key: r.ID.String(), ChargeKey: r.PaymentID.String(), Amount: r.Amount, Currency: r.Currency})
	status, reason := payments.Outcome(err, outbox.LastAttempt(job.JobRow))
	if status == "" {
		return fmt.Errorf("refund %s: %w", r.ID, err)
	}
	return database.InTenantTx(ctx, w.Pool, job.Args.Principal, database.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := Settle(ctx, tx, r, status, reason, res.ID); err != nil {
			return err
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return fmt.Errorf("complete refund job %s: %w", r.ID, database.Classify(err))
		}
		return nil
	})
}
