package idempotency

import (
	"context"
	"errors"
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

// citusStoreStatsSQL reads the same three numbers on a Citus coordinator,
// where idempotency_keys is an empty shell and its rows are in shards on the
// workers (docs/scaling.md). The lateral probe per principal above is a
// subquery Citus cannot push down ("Limit clause is currently unsupported
// when a lateral subquery references a column from a reference table").
// Instead each node reads its own shards, in one command a node
// (run_command_on_all_nodes; a command per shard, run_command_on_shards,
// took about 5 s for 32 shards), and the coordinator adds them up:
//   - the row count, each shard's estimate (or its rows up to 100,000);
//   - the size, each shard's files;
//   - the oldest live key, one probe per principal of each shard, the
//     principals found by walking the (principal_id, expires_at) index
//     from one to the next (a shard has no principals table of its own).
//
// The per-shard reads are built with format and run by query_to_xml, which
// runs a query given as text inside a plain SELECT. A node that cannot
// answer (a worker down) fails the whole reading, and the gauges are left
// out of the scrape.
const citusStoreStatsSQL = `
SELECT CASE WHEN bool_and(success) THEN sum((result::json->>'rows')::bigint) END,
       coalesce(sum((result::json->>'bytes')::bigint), 0),
       coalesce(max((result::json->>'age')::float8), 0)
FROM run_command_on_all_nodes($node$
    SELECT json_build_object(
        'rows', coalesce(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint
            ELSE (xpath('/row/n/text()', query_to_xml(format(
                'SELECT count(*) AS n FROM (SELECT 1 FROM %s LIMIT 100000) few', c.oid::regclass), false, true, '')))[1]::text::bigint END), 0),
        'bytes', coalesce(sum(pg_total_relation_size(c.oid)), 0),
        'age', max((xpath('/row/age/text()', query_to_xml(format($shard$
            WITH RECURSIVE p (id) AS (
                (SELECT principal_id FROM %1$s ORDER BY principal_id LIMIT 1)
                UNION ALL
                SELECT (SELECT principal_id FROM %1$s WHERE principal_id > p.id ORDER BY principal_id LIMIT 1)
                FROM p WHERE p.id IS NOT NULL)
            SELECT max(extract(epoch FROM now() - (
                SELECT created_at FROM %1$s k
                WHERE k.principal_id = p.id AND k.expires_at > now()
                ORDER BY k.expires_at LIMIT 1)))::float8 AS age
            FROM p WHERE p.id IS NOT NULL$shard$, c.oid::regclass), false, true, '')))[1]::text::float8))
    FROM pg_class c
    WHERE c.relkind = 'r' AND c.relname ~ '^idempotency_keys_[0-9]+$'
$node$)`

type storeStats struct {
	rows, bytes   int64
	oldestLiveAge float64
}

// storeGauges caches storeStats so that any number of scrapers, at any
// rate, cost the database at most one query per cache period.
type storeGauges struct {
	pool *database.Pool
	ttl  time.Duration
	// sql is storeStatsSQL, or citusStoreStatsSQL on a Citus coordinator;
	// chosen at the first reading.
	sql string

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
		if g.sql == "" {
			var citus bool
			if err := c.QueryRow(qctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
				return err
			}
			g.sql = storeStatsSQL
			if citus {
				g.sql = citusStoreStatsSQL
			}
		}
		var rows *int64 // null: a shard did not answer
		if err := c.QueryRow(qctx, g.sql).Scan(&rows, &s.bytes, &s.oldestLiveAge); err != nil {
			return err
		}
		if rows == nil {
			return errors.New("store gauges: a shard did not answer")
		}
		s.rows = *rows
		return nil
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
