package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

const instrumentationName = "github.com/payments-reference/idempotent-payments/internal/outbox"

// RegisterMetrics reports the outbox's health, read from River's table with
// pool (the maintenance role): jobs by state, the age of the oldest job
// waiting to run (the outbox's lag), the jobs still waiting for the relay,
// and what waits for reconciliation. Reads are cached for ttl so that a
// scrape storm costs one query. The last two read the tenants' tables, every
// shard of them on Citus: while a node is down they are left out of the
// scrape, and River's gauges (the coordinator's own table) stay.
func RegisterMetrics(mp metric.MeterProvider, pool *database.Pool, ttl time.Duration) error {
	m := mp.Meter(instrumentationName)
	jobs, err1 := m.Int64ObservableGauge("outbox_jobs",
		metric.WithDescription("Outbox jobs by kind and state (available, running, retryable, completed, discarded, ...)."))
	lag, err2 := m.Float64ObservableGauge("outbox_oldest_available_job_age_seconds",
		metric.WithDescription("How long the oldest job that could run has waited; 0 when none waits. The outbox's lag."))
	waiting, err3 := m.Int64ObservableGauge("reconciliation_waiting",
		metric.WithDescription("Payments and refunds in requires_reconciliation: the processor's answer was never seen, and the reconciler has not settled them yet."))
	oldest, err4 := m.Float64ObservableGauge("reconciliation_oldest_waiting_age_seconds",
		metric.WithDescription("Age of the oldest payment or refund waiting for reconciliation; 0 when none waits."))
	relayWaiting, err5 := m.Int64ObservableGauge("outbox_relay_waiting",
		metric.WithDescription("Jobs written by requests (outbox_jobs) that the relay has not handed to River yet."))
	relayOldest, err6 := m.Float64ObservableGauge("outbox_relay_oldest_age_seconds",
		metric.WithDescription("Age of the oldest job waiting for the relay; 0 when none waits. Above a second, the relay is stuck or behind."))
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return fmt.Errorf("outbox gauges: %w", err)
	}
	g := &gauges{pool: pool, ttl: ttl}
	_, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		s, ok := g.get(ctx)
		if !ok {
			return nil
		}
		for k, n := range s.jobs {
			o.ObserveInt64(jobs, n, metric.WithAttributes(attribute.String("kind", k.kind), attribute.String("state", k.state)))
		}
		o.ObserveFloat64(lag, s.lag)
		if s.tenantsRead {
			o.ObserveInt64(waiting, s.waiting)
			o.ObserveFloat64(oldest, s.oldestWaiting)
			o.ObserveInt64(relayWaiting, s.relayWaiting)
			o.ObserveFloat64(relayOldest, s.relayOldest)
		}
		return nil
	}, jobs, lag, waiting, oldest, relayWaiting, relayOldest)
	if err != nil {
		return fmt.Errorf("outbox gauges callback: %w", err)
	}
	return nil
}

type kindState struct{ kind, state string }

type snapshot struct {
	jobs          map[kindState]int64
	lag           float64
	waiting       int64
	oldestWaiting float64
	relayWaiting  int64
	relayOldest   float64
	// tenantsRead says whether the reads of the tenants' tables (the relay's
	// and the reconciliation's figures) succeeded.
	tenantsRead bool
}

type gauges struct {
	pool *database.Pool
	ttl  time.Duration

	mu   sync.Mutex
	at   time.Time
	last snapshot
	ok   bool
}

func (g *gauges) get(ctx context.Context) (snapshot, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ok && time.Since(g.at) < g.ttl {
		return g.last, true
	}
	s := snapshot{jobs: map[kindState]int64{}}
	err := g.pool.WithConn(ctx, func(c database.DBTX) error {
		rows, err := c.Query(ctx, `SELECT kind, state::text, count(*) FROM river_job GROUP BY kind, state`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k kindState
			var n int64
			if err := rows.Scan(&k.kind, &k.state, &n); err != nil {
				return err
			}
			s.jobs[k] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		// The fetch index (state, queue, priority, scheduled_at, id) serves this.
		if err := c.QueryRow(ctx, `
			SELECT coalesce(extract(epoch FROM now() - min(scheduled_at)), 0)::float8
			FROM river_job WHERE state = 'available' AND scheduled_at <= now()`).Scan(&s.lag); err != nil {
			return err
		}
		// The jobs not relayed yet: a few rows, unless the relay is stuck.
		// Then, across tenants, through a function: this role reads no
		// payment. On Citus both reach every worker, and fail while one is
		// down (TestAWorkerDownHoldsBackOnlyItsOwnTenants).
		s.tenantsRead = c.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM outbox_jobs`).
			Scan(&s.relayWaiting, &s.relayOldest) == nil &&
			c.QueryRow(ctx, `SELECT waiting, oldest_seconds FROM reconciliation_backlog()`).Scan(&s.waiting, &s.oldestWaiting) == nil
		return nil
	})
	g.at, g.last, g.ok = time.Now(), s, err == nil
	return s, err == nil
}
