// Package outbox runs the transactional outbox: jobs that a request writes
// in its own transaction, worked after the transaction commits. A job exists
// if and only if the request committed, so an external effect is never lost
// and never started for a request that rolled back. Workers repeat a job
// until it records its outcome, so what a job calls must be idempotent: the
// processor's calls carry keys.
//
// A request writes its job into outbox_jobs, a table distributed like the
// payment it acts on, so that on Citus the two commit on one shard, in one
// transaction; the Relay copies it into River's table, where River's
// workers take it (docs/external-effects.md; docs/scaling.md, "The outbox on
// the shard").
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// The queues, each with workers of its own, so that one kind of job can
// never hold the workers another needs: a tenant's slow webhook receivers
// fill the webhooks queue's workers, not the ones that charge every
// tenant's payments, and the reconciler never waits behind either.
const (
	// QueueProcessor holds the processor calls: charges and refunds.
	QueueProcessor = "processor"
	// QueueWebhooks holds webhook deliveries.
	QueueWebhooks = "webhooks"
	// QueueMaintenance holds the periodic reconciler.
	QueueMaintenance = "maintenance"
)

// Enqueuer gives the statement that enqueues a job for principal, to send
// in the transaction that makes the job's reason (a payment, a refund): the
// job commits with it, or neither does. A domain package needs nothing else
// of River to enqueue.
type Enqueuer interface {
	Enqueue(ctx context.Context, principal uuid.UUID, args river.JobArgs) (database.Statement, error)
}

// Writer enqueues processor jobs (QueueProcessor) by one plain INSERT into
// outbox_jobs, so the job travels in the same round trip as the row it acts
// on (River's InsertTx would be a round trip of its own) and, on Citus, to
// the same shard.
type Writer struct {
	// MaxAttempts is each job's retry budget (OUTBOX_MAX_ATTEMPTS), which
	// River would otherwise take from its client's configuration.
	MaxAttempts int
}

// Enqueue implements Enqueuer. The job's metadata carries the request's
// traceparent, as otelriver's insert middleware would write it, so every
// attempt of the job is traced in the request's trace (requestTrace).
func (w Writer) Enqueue(ctx context.Context, principal uuid.UUID, args river.JobArgs) (database.Statement, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return database.Statement{}, fmt.Errorf("encode %s job: %w", args.Kind(), err)
	}
	meta, err := Metadata(ctx)
	if err != nil {
		return database.Statement{}, fmt.Errorf("encode %s job metadata: %w", args.Kind(), err)
	}
	return database.Statement{SQL: `
		INSERT INTO outbox_jobs (principal_id, id, args, kind, max_attempts, metadata, queue)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		Args: []any{principal, uuid.New(), raw, args.Kind(), w.MaxAttempts, meta, QueueProcessor}}, nil
}

// Metadata is a job's metadata carrying ctx's trace, as otelriver's insert
// middleware writes it: every attempt of the job is traced in that trace
// (requestTrace). For a package that inserts jobs by its own SQL (webhooks'
// fan-out, which inserts one per endpoint).
func Metadata(ctx context.Context) ([]byte, error) {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return json.Marshal(carrier)
}

// EnqueueEach is one statement that writes a job of kind into queue
// (outbox_jobs, as Writer does) for every row of query: its two columns are
// the job's principal (the row's principal_id, so that on Citus the
// statement stays on that principal's shard) and args (jsonb), each row's
// args distinct; its own parameters start at $5 ($1 to $4 are the job's
// attempts, metadata, queue, and the statement's nonce), and args are
// those parameters. One statement, so a fan-out to many jobs stays one step
// of a round trip. ctx's trace goes into the jobs' metadata (Metadata).
func EnqueueEach(ctx context.Context, kind, queue string, maxAttempts int, query string, args ...any) (database.Statement, error) {
	params, err := eachParams(ctx, kind, queue, maxAttempts, args)
	if err != nil {
		return database.Statement{}, err
	}
	return database.Statement{SQL: insertEachSQL(kind, query), Args: params}, nil
}

// InsertEach is EnqueueEach run at once on db: it returns how many jobs it
// inserted, for a request that answers with the count.
func InsertEach(ctx context.Context, db database.DBTX, kind, queue string, maxAttempts int, query string, args ...any) (int64, error) {
	s, err := EnqueueEach(ctx, kind, queue, maxAttempts, query, args...)
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, s.SQL, s.Args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func eachParams(ctx context.Context, kind, queue string, maxAttempts int, args []any) ([]any, error) {
	meta, err := Metadata(ctx)
	if err != nil {
		return nil, fmt.Errorf("encode %s job metadata: %w", kind, err)
	}
	return append([]any{maxAttempts, meta, queue, uuid.New()}, args...), nil
}

// insertEachSQL names each row by a hash of the statement's nonce and the
// row's args, not by the column's default, gen_random_uuid(): Citus pushes
// an INSERT ... SELECT down to the shard only when it calls no volatile
// function, and otherwise pulls the rows to the coordinator and copies them
// back, which row-level security refuses ("COPY FROM not supported").
func insertEachSQL(kind, query string) string {
	return `
		INSERT INTO outbox_jobs (principal_id, id, args, kind, max_attempts, metadata, queue)
		SELECT j.principal_id, md5($4::text || j.args::text)::uuid, j.args, '` + kind + `', $1, $2, $3
		FROM (` + query + `) AS j (principal_id, args)`
}

// Client is the River client: it inserts jobs and, when started, works them.
type Client = river.Client[pgx.Tx]

// Config tunes the workers.
type Config struct {
	// Workers is how many processor jobs (QueueProcessor) run at once;
	// WebhookWorkers how many webhook deliveries (QueueWebhooks). Both 0
	// make an insert-only client (no Start), for a process that must not
	// work jobs.
	Workers        int
	WebhookWorkers int
	// JobTimeout bounds one attempt. RescueAfter (longer) is when a job
	// whose worker died (kill -9, a lost host) is worked again.
	JobTimeout  time.Duration
	RescueAfter time.Duration
	// MaxAttempts is the retry budget of a job; an outcome still unknown on
	// the last attempt is recorded as requires_reconciliation rather than
	// fail again (see the workers and package reconcile).
	MaxAttempts int
	// RetryBase and RetryMax shape the backoff: RetryBase * 2^(attempt-1),
	// at most RetryMax, with jitter.
	RetryBase, RetryMax time.Duration
	// Periodic jobs are inserted by the elected leader on their schedule
	// (the reconciler); only a client with Workers runs them.
	Periodic       []*river.PeriodicJob
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// NewClient returns a River client over pool (the service role's), working
// the jobs of workers. The request's trace context travels in the job's
// metadata, and every attempt is traced in the request's trace.
func NewClient(pool *database.Pool, workers *river.Workers, cfg Config) (*Client, error) {
	if cfg.RescueAfter <= cfg.JobTimeout {
		return nil, errors.New("outbox: RescueAfter must be longer than JobTimeout")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	rc := &river.Config{
		Logger:               logger,
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueAfter,
		MaxAttempts:          cfg.MaxAttempts,
		RetryPolicy:          &backoff{base: cfg.RetryBase, max: cfg.RetryMax},
		Middleware: []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
			EnableTracePropagation:      true,
			EnableWorkSpanJobKindSuffix: true,
			TracerProvider:              cfg.TracerProvider,
			MeterProvider:               cfg.MeterProvider,
		}), newRequestTrace(cfg.TracerProvider)},
		// Polling instead of LISTEN: no pooled connection is held for
		// notifications, and it works behind PgBouncer in transaction mode.
		// A new job waits up to FetchPollInterval to start, which a client
		// that reads the payment's final status later never notices.
		PollOnly:          true,
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 100 * time.Millisecond,
	}
	if cfg.Workers > 0 || cfg.WebhookWorkers > 0 {
		rc.Queues = map[string]river.QueueConfig{QueueMaintenance: {MaxWorkers: 1}}
		if cfg.Workers > 0 {
			rc.Queues[QueueProcessor] = river.QueueConfig{MaxWorkers: cfg.Workers}
		}
		if cfg.WebhookWorkers > 0 {
			rc.Queues[QueueWebhooks] = river.QueueConfig{MaxWorkers: cfg.WebhookWorkers}
		}
		rc.Workers = workers
		rc.PeriodicJobs = cfg.Periodic
	}
	client, err := river.NewClient(riverpgxv5.New(pool.Pgx()), rc)
	if err != nil {
		return nil, fmt.Errorf("outbox client: %w", err)
	}
	return client, nil
}

// backoff is exponential with full jitter, so that jobs failed by one
// processor outage do not all come back at once.
type backoff struct{ base, max time.Duration }

func (b *backoff) NextRetry(job *rivertype.JobRow) time.Time {
	d := b.max
	if shift := job.Attempt - 1; shift < 30 && b.base<<shift < b.max {
		d = b.base << shift
	}
	return time.Now().Add(d/2 + rand.N(d/2+1))
}

// LastAttempt reports whether a job's current attempt is its last: a worker
// then records an unknown outcome as requires_reconciliation instead of
// failing once more, so the job does not end with its effect unrecorded.
func LastAttempt(job *rivertype.JobRow) bool { return job.Attempt >= job.MaxAttempts }

// StartWhenReachable starts client's workers, trying again every second
// while the database cannot be reached. It returns at once: the service
// starts, and answers /healthz, while the database is down, and its jobs wait
// in the table meanwhile. onErr hears each failed try. The returned function
// stops trying and waits until no try is running; stop the client itself
// with its Stop method (a no-op if it never started). ctx is the workers'
// context for as long as they run.
func StartWhenReachable(ctx context.Context, client *Client, onErr func(error)) (giveUp func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := client.Start(ctx)
			if err == nil {
				return
			}
			onErr(err)
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// Effect is a worker's part of Perform: its own SQL and its one external
// call. R is the row the job acts on (a payment, a refund).
type Effect[R any] struct {
	// Load is the statement that reads the row, in the job's tenant, into
	// *row.
	Load func(row *R) database.Statement
	// Pending reports whether the row still waits for its answer; once it
	// is decided (an earlier run recorded the answer, or the reconciler
	// did) there is nothing to do.
	Pending func(row R) bool
	// Call makes the external call for row, with the row's stable key, and
	// returns the statements that record its answer, which commit with the
	// job's completion. An error means the outcome is unknown and the job
	// is retried. last says it is the last attempt.
	Call func(ctx context.Context, row R, last bool) (record []database.Statement, err error)
}

// completeSQL marks a running job completed, as River's JobCompleteTx does,
// as a statement that can travel in the round trip recording the job's
// answer.
// River's own completion of the job, after Work returns, then finds it done.
const completeSQL = `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1 AND state = 'running'`

// Complete is the statement that completes job, a running job, to send with
// the statements that record its answer: they commit together. It fails
// when the job is no longer running (a rescuer gave it to another worker).
func Complete(job *rivertype.JobRow) database.Statement {
	return database.Statement{SQL: completeSQL, Args: []any{job.ID}, Done: func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("complete %s job %d: it is no longer running", job.Kind, job.ID)
		}
		return nil
	}}
}

// Perform runs one attempt of a job that carries an external effect, the
// same way for every kind: read the row, call outside any transaction (a
// processor takes 100-800 ms; no connection is held meanwhile), and record
// the answer in one transaction with the job's completion. A crash before
// that transaction commits leaves the job to run again, and the repeated
// call, with the same key, is answered from the processor's record; a crash
// after it leaves nothing to do.
//
// The read and the record are one round trip each (database.SendInTenant):
// a worker mostly waits for the processor, so what it costs the machine is
// its round trips, and a busy outbox shares the CPU with the requests.
func Perform[A river.JobArgs, R any](ctx context.Context, pool *database.Pool, principal uuid.UUID, job *river.Job[A], e Effect[R]) error {
	var row R
	err := database.SendInTenant(ctx, pool, principal, e.Load(&row))
	if err != nil {
		return fmt.Errorf("%s job %d: read its row: %w", job.Kind, job.ID, err)
	}
	if !e.Pending(row) {
		return nil // a run that died after recording the answer, rescued; or reconciled
	}
	record, err := e.Call(ctx, row, LastAttempt(job.JobRow))
	if err != nil {
		return err // River retries with backoff
	}
	err = database.SendInTenant(ctx, pool, principal, append(record, Complete(job.JobRow))...)
	if err != nil {
		return fmt.Errorf("%s job %d: record its answer: %w", job.Kind, job.ID, err)
	}
	return nil
}
