package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/payments-reference/idempotent-payments/loadtest/designs"
)

// Comparison is one ratio of ours to another design, measured as
// interleaved rounds on the same table (ours, then theirs, round after
// round), so that a machine whose speed drifts during the run moves both
// sides of each round alike. One pair of runs minutes apart cannot tell a
// design's cost from the machine's noise; the spread of the rounds says how
// far a ratio can be trusted.
type Comparison struct {
	Name   string    `json:"name"`
	Ours   []float64 `json:"ours"`   // per round, requests (or transactions) per second
	Theirs []float64 `json:"theirs"` // the other design, the same rounds
	Ratios []float64 `json:"ratios"` // ours / theirs, per round
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	// Target is the ratio #23 asks for (0: none), and Verdict says where
	// the rounds fall: met (every round at or above it), missed (every
	// round below), or unresolved (the range crosses it).
	Target  float64 `json:"target,omitempty"`
	Verdict string  `json:"verdict,omitempty"`
}

// add records one round.
func (c *Comparison) add(ours, theirs float64) {
	c.Ours = append(c.Ours, ours)
	c.Theirs = append(c.Theirs, theirs)
	if theirs > 0 {
		c.Ratios = append(c.Ratios, ours/theirs)
	}
	c.Median, c.Min, c.Max = spread(c.Ratios)
	switch {
	case c.Target == 0 || len(c.Ratios) == 0:
		c.Verdict = ""
	case c.Min >= c.Target:
		c.Verdict = "met"
	case c.Max < c.Target:
		c.Verdict = "missed"
	default:
		c.Verdict = "unresolved"
	}
}

// spread is the median, smallest and largest of xs.
func spread(xs []float64) (median, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	median = s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}

// String is the comparison as a report reads it.
func (c Comparison) String() string {
	return fmt.Sprintf("%s = %.2f (range %.2f-%.2f over %d rounds)", c.Name, c.Median, c.Min, c.Max, len(c.Ratios))
}

// compareDesigns measures, at the first stage's size, ours against replays
// of its own keys, against the same payment without idempotency (the
// baseline), against the peer (the key in Redis) and against pgbench running
// the service's SQL: -repeats rounds of
// ours, replays alone, baseline, peer, pgbench, each run -compare-duration
// long after its warm-up, with the outbox drained before each.
func compareDesigns(ctx context.Context, cfg config, res *Results, d *driver, clients []client,
	warmUp func(path, label string) error, drain func(after string) error, progress io.Writer) error {
	baseline := Comparison{Name: "idempotent/baseline", Target: 0.85}
	peer := Comparison{Name: "ours/peer"}
	bench := Comparison{Name: "service/pgbench"}
	// replay/new: a run of nothing but retries of the keys the rounds
	// stored, against the round's new payments, in requests per second.
	replay := Comparison{Name: "replay/new", Target: 2.5}
	var withoutJob []float64
	measure := func(path, label string, replays float64) (Stage, error) {
		if err := warmUp(path, label+" warm-up"); err != nil {
			return Stage{}, err
		}
		m := d.run(ctx, path, replays, cfg.compareDuration, progress, label)
		var st Stage
		m.fill(&st, cfg.compareDuration)
		if st.Requests == 0 || len(st.Errors) > 0 {
			return st, fmt.Errorf("%s failed (%v)", label, st.Errors)
		}
		return st, nil
	}
	for round := 1; round <= cfg.repeats; round++ {
		tag := fmt.Sprintf(" (round %d/%d)", round, cfg.repeats)
		ours, err := measure("/v1/payments", "idempotent"+tag, cfg.replayFraction)
		if err != nil {
			return err
		}
		// The replays run once the outbox has charged the new payments, as
		// each stage's replays-alone run does.
		if err := drain("idempotent" + tag); err != nil {
			return err
		}
		r, err := measure("/v1/payments", "replays alone"+tag, 1)
		if err != nil {
			return err
		}
		replay.add(r.RPS, ours.RPS)
		if cfg.baseline {
			b, err := measure(designs.BaselinePath, "baseline (no idempotency)"+tag, 0)
			if err != nil {
				return fmt.Errorf("%w: the API at -api-url must be the load test's server (loadtest/server), or pass -baseline=false", err)
			}
			baseline.add(ours.RPS, b.RPS)
			res.BaselineP99 = b.RequestP99
		}
		if cfg.redisPeer != "" {
			p, err := measure(designs.PeerPath, "peer (claim in Redis)"+tag, cfg.replayFraction)
			if err != nil {
				return fmt.Errorf("%w: is Redis at %s? (-redis-peer \"\" skips the peer)", err, cfg.redisPeer)
			}
			peer.add(ours.RPS, p.RPS)
			res.PeerP99 = p.RequestP99
		}
		if cfg.pgbench {
			// pgbench measures the database alone: the outbox's workers
			// first finish what the designs left them.
			if err := drain("the peer" + tag); err != nil {
				return err
			}
			without, with, note, err := runPgbench(ctx, cfg, clients, progress)
			if err != nil {
				return err
			}
			if note != "" {
				res.Notes = append(res.Notes, note)
				cfg.pgbench = false
			} else {
				bench.add(ours.RPS, with)
				withoutJob = append(withoutJob, without)
			}
		}
		fmt.Fprintf(progress, "round %d/%d: idempotent %.0f req/s; %s\n", round, cfg.repeats, ours.RPS, roundSummary(baseline, replay, peer, bench))
	}
	res.IdempotentRPS, _, _ = spread(baseline.Ours)
	if len(baseline.Ours) == 0 {
		res.IdempotentRPS, _, _ = spread(peer.Ours)
	}
	for _, c := range []Comparison{baseline, replay, peer, bench} {
		if len(c.Ratios) > 0 {
			res.Comparisons = append(res.Comparisons, c)
		}
	}
	res.BaselineRPS, _, _ = spread(baseline.Theirs)
	res.OverheadRatio = baseline.Median
	res.PeerRPS, _, _ = spread(peer.Theirs)
	res.OursToPeer = peer.Median
	res.PgbenchTPS, _, _ = spread(bench.Theirs)
	res.PgbenchWithoutJobTPS, _, _ = spread(withoutJob)
	res.ServiceToPgbenchRatio = bench.Median
	return nil
}

// roundSummary is the latest round's ratios.
func roundSummary(cs ...Comparison) string {
	var out []string
	for _, c := range cs {
		if n := len(c.Ratios); n > 0 {
			out = append(out, fmt.Sprintf("%s %.2f", c.Name, c.Ratios[n-1]))
		}
	}
	return strings.Join(out, ", ")
}
