package simulator

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The load test sizes the outbox with this distribution: its median and p99
// must be the ones asked for.
func TestDrawLatencyHasTheAskedMedianAndP99(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	cfg := Config{Latency: 300 * time.Millisecond, LatencyP99: 800 * time.Millisecond}
	draws := make([]time.Duration, 100_000)
	for i := range draws {
		draws[i] = drawLatency(rng, cfg)
	}
	slices.Sort(draws)
	within := func(name string, got, want time.Duration, tolerance float64) {
		if d := float64(got-want) / float64(want); d > tolerance || d < -tolerance {
			t.Errorf("%s = %s, want %s within %.0f%%", name, got, want, 100*tolerance)
		}
	}
	within("median", draws[len(draws)/2], cfg.Latency, 0.02)
	within("p99", draws[len(draws)*99/100], cfg.LatencyP99, 0.05)

	if got := drawLatency(rng, Config{Latency: 300 * time.Millisecond}); got != 300*time.Millisecond {
		t.Errorf("without a tail the latency is fixed: got %s", got)
	}
}
