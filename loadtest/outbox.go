package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// The outbox's figures come from river_job itself: a charge job is created
// in its payment's transaction (created_at is that transaction's start) and
// finalized in the transaction that records the processor's answer
// (finalized_at). So finalized_at - created_at is the charge lag a customer
// sees (payment committed -> outcome committed, give or take the payment
// transaction's few milliseconds), and the two columns, bucketed by second,
// are payments accepted and charged per second.

// chargeKind is the charge jobs' kind in river_job.
var chargeKind = payments.ChargeArgs{}.Kind()

// Second is one second of a stage's run and of the drain after it.
type Second struct {
	T        int   `json:"t"` // seconds since the measured run began
	Accepted int64 `json:"accepted"`
	Charged  int64 `json:"charged"`
	Backlog  int64 `json:"backlog"` // accepted so far minus charged so far
}

// dbNow is the database's clock, which stamps the jobs.
func dbNow(ctx context.Context, admin *pgxpool.Pool) (time.Time, error) {
	var t time.Time
	err := admin.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}

// outboxBacklog counts the service's jobs not finished yet in queues,
// those still waiting for the relay included (pgbench's jobs sit unworked
// in a queue of their own). A job the relay has copied but not yet deleted
// counts twice for that moment.
func outboxBacklog(ctx context.Context, admin *pgxpool.Pool, queues ...string) (int64, error) {
	var left int64
	err := admin.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM river_job WHERE queue = ANY ($1) AND state NOT IN ('completed', 'discarded', 'cancelled'))
		     + (SELECT count(*) FROM outbox_jobs WHERE queue = ANY ($1))`,
		queues).Scan(&left)
	return left, err
}

// outboxDrain waits until the outbox is empty or bound has passed, and
// returns what was left: a run never waits without end for a processor
// that cannot keep up, it reports it.
func outboxDrain(ctx context.Context, admin *pgxpool.Pool, bound time.Duration) (int64, error) {
	deadline := time.Now().Add(bound)
	for {
		left, err := outboxBacklog(ctx, admin, outbox.QueueProcessor, outbox.QueueWebhooks)
		if err != nil || left == 0 || time.Now().After(deadline) {
			return left, err
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// chargeFigures fills st's outbox figures for the charge jobs of the
// measured run [from, to), read after the drain that ended at drained.
func chargeFigures(ctx context.Context, admin *pgxpool.Pool, st *Stage, from, to, drained time.Time) error {
	run := to.Sub(from).Seconds()
	var chargedInRun int64
	err := admin.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE created_at >= $1 AND created_at < $2),
		       (SELECT count(*) FROM river_job WHERE kind = $3 AND finalized_at >= $1 AND finalized_at < $2),
		       count(*) FILTER (WHERE created_at >= $1 AND created_at < $2 AND finalized_at IS NULL),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at)), 0)::float8,
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - created_at)), 0)::float8
		FROM river_job
		WHERE kind = $3 AND created_at >= $1 AND created_at < $2`, from, to, chargeKind).
		Scan(&st.ChargesAccepted, &chargedInRun, &st.ChargesLeft, &st.ChargeLagP50, &st.ChargeLagP99)
	if err != nil {
		return fmt.Errorf("charge figures: %w", err)
	}
	st.OutboxCompletedPerSec = float64(chargedInRun) / run
	if st.ChargesAccepted > 0 {
		st.ChargedToAccepted = float64(chargedInRun) / float64(st.ChargesAccepted)
	}
	// Per second, through the run and the drain after it.
	seconds := int(drained.Sub(from)/time.Second) + 1
	st.Timeline = make([]Second, seconds)
	for i := range st.Timeline {
		st.Timeline[i].T = i
	}
	rows, err := admin.Query(ctx, `
		SELECT floor(extract(epoch FROM created_at - $1))::int, count(*), 0::bigint FROM river_job
		WHERE kind = $4 AND created_at >= $1 AND created_at < $2 GROUP BY 1
		UNION ALL
		SELECT floor(extract(epoch FROM finalized_at - $1))::int, 0, count(*) FROM river_job
		WHERE kind = $4 AND finalized_at >= $1 AND finalized_at < $3 GROUP BY 1`, from, to, drained, chargeKind)
	if err != nil {
		return fmt.Errorf("charge timeline: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t int
		var accepted, charged int64
		if err := rows.Scan(&t, &accepted, &charged); err != nil {
			return err
		}
		if t >= 0 && t < seconds {
			st.Timeline[t].Accepted += accepted
			st.Timeline[t].Charged += charged
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("charge timeline: %w", err)
	}
	var backlog int64
	for i := range st.Timeline {
		backlog += st.Timeline[i].Accepted - st.Timeline[i].Charged
		st.Timeline[i].Backlog = max(0, backlog)
		if i < int(run) && st.Timeline[i].Backlog > st.PeakBacklog {
			st.PeakBacklog = st.Timeline[i].Backlog
		}
	}
	return nil
}
