// Package reconcile settles the payments and refunds whose outcome the
// outbox could not decide, from the processor's own record.
//
// A worker that runs out of attempts without a definite answer records
// requires_reconciliation: the processor may have moved the money on an
// attempt whose reply was lost, so "failed" would be a guess. A job can also
// end without deciding anything at all (its last deciding transaction failed,
// its process was killed on the last attempt, someone deleted it), leaving a
// payment processing with nothing left to run it. The Reconciler finds both
// kinds, asks the processor what it did with the row's key (a lookup, which
// never charges), and records that: charged means succeeded, declined means
// failed, and "cannot say" leaves the row waiting, in
// requires_reconciliation, for the next run. "No record" is only recorded
// (failed, not_processed) once the key cannot charge any more: the
// reconciler first cancels it at the processor, since a processor may still
// process a request it received long after the caller gave up, and records
// what the cancel answers (the money moved meanwhile: succeeded).
//
// It runs as a periodic outbox job (Worker) and as `api reconcile`.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/metric"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/refunds"
)

// Reconciler settles undecided payments and refunds.
type Reconciler struct {
	// Pool is the service role's: each row is settled in its own tenant.
	Pool      *database.Pool
	Processor processor.Processor
	// Grace is how long a row must have existed, and its job have ended,
	// before it is looked up: a call the job made may still reach the
	// processor until then, and "no record" is only final after it cannot.
	// Make it longer than the processor call's timeout.
	Grace time.Duration
	// Batch bounds the rows one run settles.
	Batch int
	// Announcer records the event of each row it decides (nil: none).
	Announcer payments.Announcer
	// Log hears every row that could not be settled, at ERROR; nil
	// discards. Errors, when set, counts them (reconciliation_errors).
	Log    *slog.Logger
	Errors metric.Int64Counter
}

// NewErrorCounter returns the counter of rows a run could not settle,
// reconciliation_errors_total in Prometheus: any increase wants a look.
func NewErrorCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	c, err := mp.Meter("github.com/payments-reference/idempotent-payments/internal/reconcile").Int64Counter("reconciliation_errors",
		metric.WithDescription("Payments and refunds a reconciliation run could not settle (the run went on with the others); each is logged at ERROR."))
	if err != nil {
		return nil, fmt.Errorf("reconciliation error counter: %w", err)
	}
	return c, nil
}

// Result counts what one run did.
type Result struct {
	Examined  int `json:"examined"`
	Succeeded int `json:"succeeded"` // the processor moved the money
	Failed    int `json:"failed"`    // it declined, refused, or has no record
	// Waiting is what stays requires_reconciliation: the processor could not
	// say this time.
	Waiting int `json:"waiting"`
	// Errors is the rows that could not be settled (logged, counted); the
	// run went on past each.
	Errors int `json:"errors"`
}

type candidate struct {
	kind, status  string
	id, principal uuid.UUID
	created       time.Time
}

// pagesPerRun bounds how many pages of Batch undecided rows one run reads
// while it looks for rows whose job has ended: during a processor outage
// most undecided rows are still their jobs', and a run must not read them
// all.
const pagesPerRun = 10

// Run settles every row that qualifies now, up to Batch of each kind. A row
// the processor cannot answer for is counted as waiting. A row that cannot be
// settled (its answer breaks a constraint, say) is logged at ERROR, counted,
// and passed over: the rows are taken oldest first, so one bad row that
// ended the run would stop every tenant's reconciliation behind it for ever.
// Only a database that cannot be reached ends the run (the rows already
// settled stay settled).
func (r *Reconciler) Run(ctx context.Context) (Result, error) {
	list, err := r.candidates(ctx)
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, c := range list {
		status, err := r.settle(ctx, c)
		if errors.Is(err, database.ErrUnavailable) || ctx.Err() != nil {
			return res, err
		}
		if err != nil {
			res.Errors++
			if r.Errors != nil {
				r.Errors.Add(ctx, 1)
			}
			if r.Log != nil {
				r.Log.Error("reconcile: could not settle a row; going on with the others",
					"kind", c.kind, "id", c.id, "principal_id", c.principal, "error", err)
			}
			continue
		}
		res.Examined++
		switch status { // the same words for payments and refunds
		case payments.StatusSucceeded:
			res.Succeeded++
		case payments.StatusFailed:
			res.Failed++
		default:
			res.Waiting++
		}
	}
	return res, nil
}

// candidates returns up to Batch undecided rows, oldest first, whose job
// ended more than Grace ago or is gone: the tenant tables are read a page at
// a time (reconciliation_candidates, across every tenant), and River's table
// is asked about each row (outbox.Live). The two are separate statements
// because on Citus the tenant tables are distributed and river_job is the
// coordinator's, and Citus cannot join them.
func (r *Reconciler) candidates(ctx context.Context) ([]candidate, error) {
	var list []candidate
	err := r.Pool.WithConn(ctx, func(c database.DBTX) error {
		after, afterID := time.Time{}, uuid.Nil
		for range pagesPerRun {
			rows, err := c.Query(ctx, `SELECT kind, id, principal_id, status, created_at FROM reconciliation_candidates($1, $2, $3, $4)`,
				r.Grace, after, afterID, r.Batch)
			if err != nil {
				return err
			}
			page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (candidate, error) {
				var c candidate
				err := row.Scan(&c.kind, &c.id, &c.principal, &c.status, &c.created)
				return c, err
			})
			if err != nil {
				return err
			}
			for _, cand := range page {
				kind, field := payments.ChargeArgs{}.Kind(), "payment_id"
				if cand.kind == "refund" {
					kind, field = refunds.Args{}.Kind(), "refund_id"
				}
				live, err := outbox.Live(ctx, c, kind, field, cand.id, r.Grace)
				if err != nil {
					return err
				}
				if !live {
					list = append(list, cand)
				}
				if len(list) == r.Batch {
					return nil
				}
			}
			if len(page) < r.Batch {
				return nil
			}
			after, afterID = page[len(page)-1].created, page[len(page)-1].id
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find rows to reconcile: %w", err)
	}
	return list, nil
}

// settle looks one row up at the processor and records the answer. Its
// UPDATE only moves a row that is still undecided, so a worker that decided
// it meanwhile wins, and a second reconciler changes nothing.
func (r *Reconciler) settle(ctx context.Context, c candidate) (string, error) {
	op := processor.OpCharge
	if c.kind == "refund" {
		op = processor.OpRefund
	}
	// The processor knows the row by its processor key (the client's
	// intent, or the id for rows from before migration 18): read the row
	// first. What is read is what the settle records beside the answer;
	// nothing else of an undecided row changes meanwhile, and the settle's
	// UPDATE moves it only if it is still undecided.
	var (
		p   payments.Payment
		rf  refunds.Refund
		rec = processor.Record{Op: op}
	)
	err := database.InTenantTx(ctx, r.Pool, c.principal, database.TxOptions{ReadOnly: true}, func(tx pgx.Tx) error {
		var err error
		if c.kind == "payment" {
			p, err = payments.Get(ctx, tx, c.principal, c.id)
			rec.Key = p.ProcessorKey
			return err
		}
		rf, err = refunds.Get(ctx, tx, c.principal, c.id)
		rec.Key, rec.ChargeID = rf.ProcessorKey, rf.ChargeID
		return err
	})
	if err != nil {
		return "", fmt.Errorf("reconcile %s %s: read it: %w", c.kind, c.id, err)
	}
	// A lookup is never retried within a run: "cannot say" leaves the row
	// waiting for the next one (last = true makes it requires_reconciliation).
	res, lookupErr := r.Processor.Lookup(ctx, rec)
	if errors.Is(lookupErr, processor.ErrNoRecord) {
		// Nothing moved so far; close the key so that nothing can.
		res, lookupErr = r.Processor.Cancel(ctx, rec)
	}
	// The same words for payments and refunds.
	status, reason := payments.Decision(lookupErr, true)
	var settle []database.Statement
	if c.kind == "payment" {
		settle, _, err = payments.Settle(ctx, r.Announcer, payments.SettleParams{Principal: c.principal, Payment: p, Status: status, Reason: reason, ProcessorID: res.ID})
	} else {
		settle, _, err = refunds.Settle(ctx, r.Announcer, refunds.SettleParams{Principal: c.principal, Refund: rf, Status: status, Reason: reason, ProcessorID: res.ID})
	}
	// One round trip: a settle whose connection was lost is decided again
	// by the next run (its UPDATE moves undecided rows only).
	if err == nil {
		err = database.SendInTenant(ctx, r.Pool, c.principal, settle...)
	}
	if err != nil {
		return "", fmt.Errorf("reconcile %s %s: %w", c.kind, c.id, err)
	}
	return status, nil
}

// Args is the periodic outbox job that runs the Reconciler.
type Args struct{}

// Kind names the job in River's table.
func (Args) Kind() string { return "reconcile" }

// InsertOpts: one attempt; the next period is the retry.
func (Args) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 1, Queue: outbox.QueueMaintenance}
}

// Worker runs the Reconciler as an outbox job.
type Worker struct {
	river.WorkerDefaults[Args]
	Reconciler *Reconciler
}

// Work runs one reconciliation.
func (w *Worker) Work(ctx context.Context, _ *river.Job[Args]) error {
	_, err := w.Reconciler.Run(ctx)
	return err
}

// Periodic returns the periodic job that runs the Reconciler every interval,
// and once when the outbox starts, on the elected leader only.
func Periodic(interval time.Duration) *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(interval),
		func() (river.JobArgs, *river.InsertOpts) { return Args{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true})
}
