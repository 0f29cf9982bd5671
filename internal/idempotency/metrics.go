package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// storeStatsSQL reads the key store's health in one round trip, and stays
// cheap at 100 million rows:
//   - the row count is the planner's estimate (pg_class.reltuples, kept by
//     ANALYZE and autovacuum), never count(*), which would scan the table;
//   - the size comes from the files' sizes (pg_total_relation_size);
//   - the oldest live key is the oldest of each principal's first entry past
//     now() in the (principal_id, expires_at) index (expires_at = created_at
//   - retention, so it is the oldest live created_at): one index probe and
//     one heap fetch per principal;
//
// reltuples is -1 for a table never analyzed (a new one, before autovacuum's
// first ANALYZE): then the rows are counted, up to 100,000, so the gauge is
// never 0 for a table that has rows, and the count stays cheap.
const storeStatsSQL = `
SELECT
    (SELECT CASE WHEN reltuples >= 0 THEN reltuples::bigint
                 ELSE (SELECT count(*) FROM (SELECT 1 FROM idempotency_keys LIMIT 100000) few) END
     FROM pg_class WHERE oid = 'idempotency_keys'::regclass),
    pg_total_relation_size('idempotency_keys'::regclass),
    coalesce((SELECT max(extract(epoch FROM now() - o.created_at))::float8
              FROM principals p CROSS JOIN LATERAL (
                  SELECT created_at FROM idempotency_keys k
                  WHERE k.principal_id = p.id AND k.expires_at > now()
                  ORDER BY k.expires_at LIMIT 1) o), 0)`

type storeStats struct {
	rows, bytes   int64
	oldestLiveAge float64
}

// storeGauges caches storeStats so that any number of scrapers, at any
// rate, cost the database at most one query per cache period.
type storeGauges struct {
	pool *database.Pool
	ttl  time.Duration

	mu      sync.Mutex
	stats   storeStats
	fetched time.Time
	ok      bool
}

func (g *storeGauges) get(ctx context.Context) (storeStats, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(g.fetched) < g.ttl {
		return g.stats, g.ok
	}
	g.fetched = time.Now()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var s storeStats
	err := g.pool.WithConn(qctx, func(c database.DBTX) error {
		return c.QueryRow(qctx, storeStatsSQL).Scan(&s.rows, &s.bytes, &s.oldestLiveAge)
	})
	// On error the gauges are left out of the scrape rather than showing
	// stale numbers as if they were current.
	g.stats, g.ok = s, err == nil
	return g.stats, g.ok
}

// RegisterStoreMetrics exports the key store's health as gauges, read
// through pool (the maintenance role, which may see every tenant's
// timestamps) and cached for ttl:
// idempotency_keys_rows, idempotency_keys_bytes and
// idempotency_oldest_live_key_age_seconds.
//
// There is no gauge of committed in_progress rows: a claim commits together
// with its outcome, so there are none, and counting them would need the
// partial index on state that kept every completion from being a HOT update
// (migrations/000008_hot_completion.up.sql).
func RegisterStoreMetrics(mp metric.MeterProvider, pool *database.Pool, ttl time.Duration) error {
	m := mp.Meter(instrumentationName)
	g := &storeGauges{pool: pool, ttl: ttl}
	rows, err1 := m.Int64ObservableGauge("idempotency_keys_rows",
		metric.WithDescription("Rows in idempotency_keys, the planner's estimate (pg_class.reltuples)."))
	size, err2 := m.Int64ObservableGauge("idempotency_keys_bytes",
		metric.WithDescription("Bytes of idempotency_keys, its indexes and TOAST included."))
	oldest, err3 := m.Float64ObservableGauge("idempotency_oldest_live_key_age_seconds",
		metric.WithDescription("Age of the oldest key not yet expired; about the retention period in steady state."))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return fmt.Errorf("store gauges: %w", err)
		}
	}
	_, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		s, ok := g.get(ctx)
		if !ok {
			return nil
		}
		o.ObserveInt64(rows, s.rows)
		o.ObserveInt64(size, s.bytes)
		o.ObserveFloat64(oldest, s.oldestLiveAge)
		return nil
	}, rows, size, oldest)
	if err != nil {
		return fmt.Errorf("store gauges callback: %w", err)
	}
	return nil
}
