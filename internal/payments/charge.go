package payments

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/riverqueue/river"

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

// ChargeWorker charges a processing payment and records the answer, with
// outbox.Perform: the processor's key is the payment's id, so every attempt
// of the job, and a second run after a crash, is the same charge to the
// processor, which charges once and replays its answer.
type ChargeWorker struct {
	river.WorkerDefaults[ChargeArgs]
	Pool      *database.Pool // the service role; the tenant is set per job
	Processor processor.Processor
	// Announcer records each decided payment's event (nil: none).
	Announcer Announcer
}

// Work runs one attempt.
func (w *ChargeWorker) Work(ctx context.Context, job *river.Job[ChargeArgs]) error {
	return outbox.Perform(ctx, w.Pool, job.Args.Principal, job, outbox.Effect[Payment]{
		Load:    func(p *Payment) database.Statement { return Load(job.Args.Principal, job.Args.PaymentID, p) },
		Pending: func(p Payment) bool { return p.Status == StatusProcessing },
		Call: func(ctx context.Context, p Payment, last bool) ([]database.Statement, error) {
			res, err := w.Processor.Charge(ctx, processor.Charge{Key: p.ProcessorKey, Amount: p.Amount, Currency: p.Currency, Reference: p.ID.String()})
			status, reason := Decision(err, last)
			if status == "" {
				return nil, fmt.Errorf("charge payment %s: %w", p.ID, err)
			}
			record, _, err := Settle(ctx, w.Announcer, SettleParams{Principal: job.Args.Principal, Payment: p, Status: status, Reason: reason, ProcessorID: res.ID})
			return record, err
		},
	})
}

// Decision maps a processor call's error (a charge or a refund, or the
// reconciler's lookup) to the status and failure reason to record, or ""
// when the call must be repeated (processor.Judge). An unknown outcome on the
// last attempt is requires_reconciliation, never failed. Refunds use it too:
// their decided statuses are the same words.
func Decision(err error, last bool) (status string, reason *string) {
	verdict, why := processor.Judge(err, last)
	switch verdict {
	case processor.Moved:
		return StatusSucceeded, nil
	case processor.NotMoved:
		// The processor's words, kept as the column can hold them: a reason
		// it refused would leave the payment undecided for ever.
		why = database.StorableText(why, MaxProcessorTextLength)
		return StatusFailed, &why
	case processor.Unknown:
		return StatusRequiresReconciliation, nil
	}
	return "", nil
}
