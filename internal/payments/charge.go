package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/processor"
)

// ChargeArgs is the outbox job that charges one payment.
type ChargeArgs struct {
	PaymentID uuid.UUID `json:"payment_id"`
	Principal uuid.UUID `json:"principal_id"`
}

// Kind names the job in River's table.
func (ChargeArgs) Kind() string { return "charge_payment" }

// ChargeWorker charges a processing payment and records the answer.
//
// The processor's key is the payment's id, so every attempt of the job, and a
// second run after a crash, is the same charge to the processor: it charges
// once and replays its answer. The answer is recorded in one transaction with
// the job's completion, so a crash before that transaction commits leaves the
// job to run again, and a crash after it leaves nothing to do.
type ChargeWorker struct {
	river.WorkerDefaults[ChargeArgs]
	Pool      *database.Pool // the service role; the tenant is set per job
	Processor processor.Processor
}

// Work runs one attempt.
func (w *ChargeWorker) Work(ctx context.Context, job *river.Job[ChargeArgs]) error {
	var p Payment
	err := database.InTenantTx(ctx, w.Pool, job.Args.Principal, database.TxOptions{ReadOnly: true}, func(tx pgx.Tx) (err error) {
		p, err = Get(ctx, tx, job.Args.PaymentID)
		return err
	})
	if err != nil {
		return fmt.Errorf("charge payment %s: %w", job.Args.PaymentID, err)
	}
	if p.Status != StatusProcessing {
		return nil // a run that died after recording the answer, rescued; or reconciled
	}
	res, err := w.Processor.Charge(ctx, processor.Charge{Key: p.ID.String(), Amount: p.Amount, Currency: p.Currency})
	status, reason := Outcome(err, outbox.LastAttempt(job.JobRow))
	if status == "" {
		return fmt.Errorf("charge payment %s: %w", p.ID, err) // River retries with backoff
	}
	return database.InTenantTx(ctx, w.Pool, job.Args.Principal, database.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := Settle(ctx, tx, p.ID, status, reason, res.ID); err != nil {
			return err
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return fmt.Errorf("complete charge job of %s: %w", p.ID, database.Classify(err))
		}
		return nil
	})
}

// Failure reasons recorded when the processor gave no usable answer.
const (
	// ReasonProcessorRejected: the processor refused the request itself (a
	// bug on this side); nothing was charged.
	ReasonProcessorRejected = "processor_rejected"
	// ReasonNotProcessed: the reconciler asked the processor, after every
	// attempt had ended, and it has no record of the key: nothing moved.
	ReasonNotProcessed = "not_processed"
)

// Outcome maps a processor call's error (a charge, a refund, or the
// reconciler's lookup) to the status and failure reason to record, or ""
// when the call must be repeated. An unknown outcome on the last attempt is
// recorded as requires_reconciliation, never as a failure: the processor may
// have moved the money on an attempt whose answer was lost. The refunds
// worker and the reconciler record their answers the same way.
func Outcome(err error, last bool) (status string, reason *string) {
	var declined *processor.DeclineError
	var rejected *processor.RejectedError
	switch {
	case err == nil:
		return StatusSucceeded, nil
	case errors.As(err, &declined):
		return StatusFailed, &declined.Reason
	case errors.As(err, &rejected):
		r := ReasonProcessorRejected
		return StatusFailed, &r
	case errors.Is(err, processor.ErrNoRecord):
		r := ReasonNotProcessed
		return StatusFailed, &r
	case last:
		return StatusRequiresReconciliation, nil
	}
	return "", nil
}
