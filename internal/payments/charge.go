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
		return nil // a run that died after recording the answer, rescued
	}
	res, err := w.Processor.Charge(ctx, processor.Charge{Key: p.ID.String(), Amount: p.Amount, Currency: p.Currency})
	status, reason := Outcome(err, outbox.LastAttempt(job.JobRow))
	if status == "" {
		return fmt.Errorf("charge payment %s: %w", p.ID, err) // River retries with backoff
	}
	return database.InTenantTx(ctx, w.Pool, job.Args.Principal, database.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			UPDATE payments SET status = $2, failure_reason = $3, processor_id = NULLIF($4, '')
			WHERE id = $1 AND status = 'processing'`,
			p.ID, status, reason, res.ID); err != nil {
			return fmt.Errorf("record charge of %s: %w", p.ID, database.Classify(err))
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
	// ReasonProcessorUnavailable: no definite answer within the retry
	// budget. The processor may have charged on an attempt whose answer was
	// lost; reconcile by the processor key, the payment's id.
	ReasonProcessorUnavailable = "processor_unavailable"
)

// Outcome maps a processor call's error to the status and failure reason to
// record, or "" when the call must be repeated. On the last attempt an
// unknown outcome is recorded as a failure rather than left undecided. The
// refunds worker records its answers the same way.
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
	case last:
		r := ReasonProcessorUnavailable
		return StatusFailed, &r
	}
	return "", nil
}
