package database

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// The lists' lag: how long the lists have been holding out rows that are
// committed. A transaction still open at the lists' horizon (list_horizon(),
// migration 17) keeps every payment and event committed after it out of
// GET /v1/payments and /v1/events until it ends; the service's own
// transactions end within DB_IDLE_IN_TX_TIMEOUT and REQUEST_TIMEOUT, so a
// lag above those is someone else's transaction in this database.
// PostgreSQL tells no role without pg_read_all_stats when another role's
// transaction began, so the lag is read from the snapshots instead: each
// collection samples pg_snapshot_xmax (one past the newest transaction that
// completed), and rows are held out from the first sample whose xmax had
// passed the horizon. The figure is a lower bound, short by at most one
// collection interval; a horizon held while nothing newer completes hides
// nothing, and reads 0.

// horizonSample is a snapshot's xmax at one moment.
type horizonSample struct {
	at   time.Time
	next uint64 // pg_snapshot_xmax: one past the newest completed xid
}

// horizonMemory is how far back the samples go; an older horizon reads as
// this old.
const horizonMemory = time.Hour

type horizonLag struct {
	pool    *Pool
	mu      sync.Mutex
	samples []horizonSample
}

// RegisterListLag reports list_horizon_lag_seconds, read through pool (the
// maintenance role's) at each collection.
func RegisterListLag(mp metric.MeterProvider, pool *Pool) error {
	m := mp.Meter("github.com/payments-reference/idempotent-payments/internal/database")
	g, err := m.Float64ObservableGauge("list_horizon_lag_seconds",
		metric.WithDescription("How long the lists (payments, refunds, events, deliveries) have held out committed rows behind a transaction of this database still open; 0 when they hold out none. A lower bound, short by at most one collection interval."))
	if err != nil {
		return fmt.Errorf("list lag gauge: %w", err)
	}
	h := &horizonLag{pool: pool}
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		lag, err := h.collect(ctx, time.Now())
		if err != nil {
			return nil // the database is down: other gauges say so
		}
		o.ObserveFloat64(g, lag.Seconds())
		return nil
	}, g)
	if err != nil {
		return fmt.Errorf("list lag callback: %w", err)
	}
	return nil
}

// collect samples the snapshot's xmax and the horizon, and returns the lag.
func (h *horizonLag) collect(ctx context.Context, now time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var horizon, next uint64
	err := h.pool.WithConn(ctx, func(c DBTX) error {
		return c.QueryRow(ctx, `SELECT list_horizon()::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&horizon, &next)
	})
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples = append(h.samples, horizonSample{at: now, next: next})
	for len(h.samples) > 1 && now.Sub(h.samples[0].at) > horizonMemory {
		h.samples = h.samples[1:]
	}
	return lagOf(h.samples, horizon, now), nil
}

// lagOf is how long rows past horizon have been held out, as far as samples
// tell: from the first sample in which a transaction past it had completed.
// A horizon at the newest xmax holds out nothing.
func lagOf(samples []horizonSample, horizon uint64, now time.Time) time.Duration {
	if len(samples) == 0 || horizon >= samples[len(samples)-1].next {
		return 0
	}
	for _, s := range samples {
		if s.next > horizon {
			return now.Sub(s.at)
		}
	}
	return 0
}
