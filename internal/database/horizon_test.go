package database

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLagOf(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	samples := []horizonSample{{t0, 100}, {t0.Add(15 * time.Second), 150}, {t0.Add(30 * time.Second), 200}}
	now := t0.Add(30 * time.Second)
	require.Zero(t, lagOf(samples, 200, now), "nothing in flight holds the horizon")
	require.Equal(t, 15*time.Second, lagOf(samples, 120, now), "xid 120 began after the first sample, by the second")
	require.Equal(t, 30*time.Second, lagOf(samples, 90, now), "older than the samples: as old as they go")
	require.Zero(t, lagOf(nil, 5, now))
}
