package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// SweeperLockID is the advisory lock that keeps sweeps of one database to one
// at a time, whatever the number of service instances. Any constant works;
// this one spells "idemswp" in ASCII.
const SweeperLockID int64 = 0x6964656d737770

// ErrSweepBusy means another sweeper holds the lock; this one did nothing.
var ErrSweepBusy = errors.New("another sweeper is running")

// sweepChunkSQL deletes at most $2 of principal $1's expired rows, oldest
// first, through the (principal_id, expires_at) index. The inner SELECT
// locks the rows it picks and skips rows that are locked: those are being
// taken over by a late retry right now. The outer WHERE checks expires_at
// again, so a row that a retry took over (and gave a new expires_at)
// between the pick and the delete survives. Row-level security adds the
// same condition a third time for this role.
//
// It works one principal at a time so that each statement stays on one
// shard of a table distributed by principal: FOR UPDATE SKIP LOCKED cannot
// span shards (docs/scaling.md). On one server the price is one index probe
// per principal with nothing to sweep.
const sweepChunkSQL = `
DELETE FROM idempotency_keys k
USING (
    SELECT principal_id, endpoint, key
    FROM idempotency_keys
    WHERE principal_id = $1 AND expires_at < now()
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) expired
WHERE k.principal_id = $1
  AND k.endpoint = expired.endpoint
  AND k.key = expired.key
  AND k.expires_at < now()`

// sweepUsageSQL deletes principal $1's usage buckets older than $2.
const sweepUsageSQL = `DELETE FROM idempotency_key_usage WHERE principal_id = $1 AND bucket < $2`

// SweeperConfig bounds a sweep.
type SweeperConfig struct {
	// Chunk is the most rows one DELETE removes (and one transaction holds
	// locked).
	Chunk int
	// Pause is the wait between chunks, leaving I/O and WAL bandwidth to
	// requests.
	Pause time.Duration
	// Retention is how long keys live, the window plus the margin; usage
	// buckets older than that are deleted too.
	Retention time.Duration
	// MeterProvider receives idempotency_sweeper_deleted_rows_total and
	// idempotency_sweeper_last_run_timestamp_seconds; nil means none.
	MeterProvider metric.MeterProvider
}

// Sweeper deletes expired keys in bounded chunks.
type Sweeper struct {
	pool    *database.Pool
	cfg     SweeperConfig
	deleted metric.Int64Counter
	lastRun atomic.Int64 // unix seconds of the last completed sweep
	// OnSweep, when set, is called after every sweep that ran.
	OnSweep func(deleted int64)
	// OnChunk, when set, is called after every chunk with the rows it
	// deleted and how long its statement (and so its row locks) took.
	OnChunk func(deleted int64, took time.Duration)
}

// NewSweeper returns a sweeper on pool, which must connect as the
// maintenance role: the only role allowed to delete keys, and only expired
// ones.
func NewSweeper(pool *database.Pool, cfg SweeperConfig) (*Sweeper, error) {
	s := &Sweeper{pool: pool, cfg: cfg}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	var err error
	s.deleted, err = m.Int64Counter("idempotency_sweeper_deleted_rows",
		metric.WithDescription("Expired keys deleted by this instance's sweeper."))
	if err != nil {
		return nil, fmt.Errorf("sweeper counter: %w", err)
	}
	// Present from the start, at 0: a sweep of a database with no
	// principals yet runs no chunk to add to it.
	s.deleted.Add(context.Background(), 0)
	_, err = m.Float64ObservableGauge("idempotency_sweeper_last_run_timestamp",
		metric.WithUnit("s"),
		metric.WithDescription("Unix time of this instance's last completed sweep; absent until one ran."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			if t := s.lastRun.Load(); t > 0 {
				o.Observe(float64(t))
			}
			return nil
		}))
	if err != nil {
		return nil, fmt.Errorf("sweeper gauge: %w", err)
	}
	return s, nil
}

// Sweep deletes every row that is expired when it starts, chunk by chunk,
// and returns how many it deleted. It returns ErrSweepBusy at once when
// another sweeper (in this or another process) is running.
func (s *Sweeper) Sweep(ctx context.Context) (int64, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()

	// A session-level lock held on this connection for the whole sweep; each
	// chunk commits on its own, so no transaction stays open between chunks.
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, SweeperLockID).Scan(&locked); err != nil {
		return 0, fmt.Errorf("sweeper lock: %w", database.Classify(err))
	}
	if !locked {
		return 0, ErrSweepBusy
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, SweeperLockID); err != nil {
			// The lock must not outlive the sweep on a pooled connection.
			_ = conn.Conn().Close(uctx)
		}
	}()

	var total int64
	usageBefore := time.Now().Add(-s.cfg.Retention - time.Hour).UTC().Truncate(time.Hour)
	err = database.EachPrincipal(ctx, conn, func(principal uuid.UUID) error {
		for {
			start := time.Now()
			tag, err := conn.Exec(ctx, sweepChunkSQL, principal, s.cfg.Chunk)
			if err != nil {
				return fmt.Errorf("sweep chunk: %w", database.Classify(err))
			}
			if s.OnChunk != nil {
				s.OnChunk(tag.RowsAffected(), time.Since(start))
			}
			total += tag.RowsAffected()
			s.deleted.Add(ctx, tag.RowsAffected())
			if tag.RowsAffected() < int64(s.cfg.Chunk) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(s.cfg.Pause):
			}
		}
		// Usage buckets are few (one per principal per hour).
		if _, err := conn.Exec(ctx, sweepUsageSQL, principal, usageBefore); err != nil {
			return fmt.Errorf("sweep usage buckets: %w", database.Classify(err))
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	s.lastRun.Store(time.Now().Unix())
	if s.OnSweep != nil {
		s.OnSweep(total)
	}
	return total, nil
}

// Run sweeps every interval until ctx ends. Errors go to onError; a busy
// lock is not an error (another instance is sweeping).
func (s *Sweeper) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.Sweep(ctx); err != nil && !errors.Is(err, ErrSweepBusy) && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
