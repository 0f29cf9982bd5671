package scenario

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNum(t *testing.T) {
	t.Parallel()
	for v, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 100_000: "100,000", 1_234_567: "1,234,567", -45_000: "-45,000"} {
		require.Equal(t, want, num(v))
	}
}

// Without the index, a chunk's DELETE reads the table twice (the chunk's
// subquery and the join back to it): each scan drops the same live rows,
// and row 7 once reported their sum, 180,000 "on 100,000 rows".
func TestRowsReadAndDroppedPerScan(t *testing.T) {
	t.Parallel()
	plan := `Delete on lab_keys_noindex k (actual time=80.1..80.1 rows=0 loops=1)
  ->  Hash Join (actual time=41.0..79.0 rows=1000 loops=1)
        ->  Seq Scan on lab_keys_noindex k (actual time=0.01..30.2 rows=10000 loops=1)
              Filter: (expires_at < now())
              Rows Removed by Filter: 90000
        ->  Hash (actual time=40.9..40.9 rows=1000 loops=1)
              ->  Subquery Scan on expired (actual time=40.1..40.7 rows=1000 loops=1)
                    ->  Limit (actual time=40.1..40.5 rows=1000 loops=1)
                          ->  Sort (actual time=40.1..40.3 rows=1000 loops=1)
                                ->  Seq Scan on lab_keys_noindex (actual time=0.01..35.0 rows=10000 loops=1)
                                      Filter: ((principal_id = $1) AND (expires_at < now()))
                                      Rows Removed by Filter: 90000`
	most, scans := rowsReadAndDropped(plan)
	require.Equal(t, 90_000, most)
	require.Equal(t, 2, scans)
	most, scans = rowsReadAndDropped("Index Scan using idempotency_keys_expires_at_idx on idempotency_keys")
	require.Zero(t, most)
	require.Zero(t, scans)
}
