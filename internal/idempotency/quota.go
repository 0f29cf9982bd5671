package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// Quota limits how many live keys one principal may hold, without putting a
// counter row on the request path.
//
// A naive quota (a counter per principal, incremented in the claiming
// transaction) would serialize all of a principal's requests on that one row
// for the length of each transaction. Instead each instance counts committed
// claims in memory and adds them to idempotency_key_usage (one row per
// principal per hour) in one statement per flush; the live-key count is the
// sum of the principal's buckets inside the retention period, read at most
// once per refresh interval per principal and cached.
//
// The price is precision, in both directions and bounded: a principal can
// overshoot by what it claims during one refresh interval (plus what other
// instances have not flushed yet), counts not yet flushed are lost if the
// process dies, and whole-hour buckets count a key for up to an hour past its
// expiry. For a guard against runaway clients with a generous limit, that is
// the right trade; docs/retention.md has the numbers.
type Quota struct {
	pool      *database.Pool
	limit     int64
	retention time.Duration
	refresh   time.Duration
	now       func() time.Time

	mu      sync.Mutex
	pending map[bucketKey]int64
	cache   map[uuid.UUID]cachedCount
}

type bucketKey struct {
	principal uuid.UUID
	bucket    time.Time
}

type cachedCount struct {
	count   int64
	fetched time.Time
}

// QuotaConfig configures a Quota.
type QuotaConfig struct {
	// Limit is the most live keys per principal. Must be positive.
	Limit int64
	// Retention is how long keys live, the window plus the margin.
	Retention time.Duration
	// Refresh is how long a principal's count is cached, and how often
	// Run flushes this instance's counts.
	Refresh time.Duration
}

// NewQuota returns a quota on pool (the service role). Call Run to flush.
func NewQuota(pool *database.Pool, cfg QuotaConfig) *Quota {
	return &Quota{
		pool:      pool,
		limit:     cfg.Limit,
		retention: cfg.Retention,
		refresh:   cfg.Refresh,
		now:       time.Now,
		pending:   map[bucketKey]int64{},
		cache:     map[uuid.UUID]cachedCount{},
	}
}

// Allow reports whether principal may claim a new key. A count not cached
// is read through db, the request's transaction.
func (q *Quota) Allow(ctx context.Context, db database.DBTX, principal uuid.UUID) (bool, error) {
	now := q.now()
	q.mu.Lock()
	c, ok := q.cache[principal]
	q.mu.Unlock()
	if !ok || now.Sub(c.fetched) > q.refresh {
		var err error
		c.count, err = q.load(ctx, db, principal, now)
		if err != nil {
			return false, err
		}
		c.fetched = now
		q.mu.Lock()
		// Claims this instance has not flushed yet are not in the table.
		for k, n := range q.pending {
			if k.principal == principal {
				c.count += n
			}
		}
		q.cache[principal] = c
		q.mu.Unlock()
	}
	return c.count < q.limit, nil
}

// allowNew returns ErrQuotaExceeded when principal may not take a new key;
// a nil Quota allows every key.
func (q *Quota) allowNew(ctx context.Context, db database.DBTX, principal uuid.UUID) error {
	if q == nil {
		return nil
	}
	ok, err := q.Allow(ctx, db, principal)
	if err != nil {
		return err
	}
	if !ok {
		return ErrQuotaExceeded
	}
	return nil
}

// Record counts one committed claim of principal.
func (q *Quota) Record(principal uuid.UUID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending[bucketKey{principal, q.now().UTC().Truncate(time.Hour)}]++
	if c, ok := q.cache[principal]; ok {
		// Keep this instance's own claims visible between refreshes.
		c.count++
		q.cache[principal] = c
	}
}

func (q *Quota) load(ctx context.Context, db database.DBTX, principal uuid.UUID, now time.Time) (int64, error) {
	since := now.Add(-q.retention).UTC().Truncate(time.Hour)
	var n int64
	err := db.QueryRow(ctx,
		`SELECT coalesce(sum(claims), 0) FROM idempotency_key_usage WHERE principal_id = $1 AND bucket >= $2`,
		principal, since).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("load key quota usage: %w", err)
	}
	return n, nil
}

// Flush adds this instance's counts to the table in one statement.
func (q *Quota) Flush(ctx context.Context) error {
	q.mu.Lock()
	batch := q.pending
	q.pending = map[bucketKey]int64{}
	// Forget cached counts nobody asked for lately, so the cache stays
	// bounded by the number of recently active principals.
	for p, c := range q.cache {
		if q.now().Sub(c.fetched) > 10*q.refresh {
			delete(q.cache, p)
		}
	}
	q.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	principals := make([]uuid.UUID, 0, len(batch))
	buckets := make([]time.Time, 0, len(batch))
	counts := make([]int64, 0, len(batch))
	for k, n := range batch {
		principals = append(principals, k.principal)
		buckets = append(buckets, k.bucket)
		counts = append(counts, n)
	}
	err := q.pool.WithConn(ctx, func(c database.DBTX) error {
		// The service role may only add claims, through this function
		// (migrations/000005_least_privilege.up.sql).
		_, err := c.Exec(ctx, `SELECT add_idempotency_key_claims($1::uuid[], $2::timestamptz[], $3::bigint[])`,
			principals, buckets, counts)
		return err
	})
	if err != nil {
		// Put the counts back so the next flush retries them.
		q.mu.Lock()
		for k, n := range batch {
			q.pending[k] += n
		}
		q.mu.Unlock()
		return fmt.Errorf("flush key quota usage: %w", err)
	}
	return nil
}

// Run flushes every refresh interval until ctx ends, then once more.
func (q *Quota) Run(ctx context.Context, onError func(error)) {
	t := time.NewTicker(q.refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := q.Flush(fctx); err != nil {
				onError(err)
			}
			return
		case <-t.C:
			if err := q.Flush(ctx); err != nil {
				onError(err)
			}
		}
	}
}
