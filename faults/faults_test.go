package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The fault suite, small: every fault is injected, every invariant holds,
// and the faults were felt (unknown outcomes labelled and resolved by the
// same key, replays, a key held by a vanished holder). .ci/run also runs
// `go run ./faults`, which prints the figures.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: the fault suite, about 80 s; the full test command (and CI) runs it")
	}
	t.Parallel()
	// The API's pool (6), its outbox's (2) and maintenance pool (2), the
	// suite's own (2), two sessions held by half-open holders until they
	// time out, and spare.
	db := testdb.New(t, 16)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	res := runHeld(t, ctx, config{
		adminURL: db.AdminURL, phase: 2 * time.Second, workers: 8,
		intentDeadline: 30 * time.Second, idleInTx: 2 * time.Second, out: out,
	}, &progress)
	for _, p := range res.Phases[1:] {
		require.Positive(t, p.Faults, "phase %q injected nothing", p.Name)
	}
	// A fault at a request's COMMIT is answered outcome-unknown; faults at
	// the outbox workers' COMMITs are not seen by clients at all. So is a
	// COMMIT that met no fault but whose request ran out of time before the
	// reply (on a busy machine a request can reach its COMMIT late): those
	// the proxy counts too, and nothing else may be called unknown.
	for _, p := range res.Phases[1:5] {
		require.Positive(t, p.Replies["503 outcome-unknown"], "phase %q: %v", p.Name, p.Replies)
		require.LessOrEqual(t, p.Replies["503 outcome-unknown"], p.Faults+p.CommitsGivenUp,
			"phase %q: %v (%d COMMITs given up without a fault)", p.Name, p.Replies, p.CommitsGivenUp)
	}
	require.Positive(t, res.UnknownCommitted+res.UnknownNotCommitted, "no unknown outcome was resolved by the same key")
	require.LessOrEqual(t, res.UnknownCommitted+res.UnknownNotCommitted, res.UnknownIntents)
	require.LessOrEqual(t, res.UnknownIntents, res.Unknown)
	require.Positive(t, res.Phases[4].Replies["409 idempotency-request-in-progress"], "no key was held by a vanished holder")
	require.Positive(t, res.Payments)
	require.Positive(t, res.Refunds)
}

// The fault suite on a Citus cluster (issue #33): under load, a worker's
// machine lost (kill -9 of every process of it), then the coordinator's,
// each started again; every invariant of the suite holds, with tenants on
// both workers. `go run ./faults -citus` runs the same, for its figures
// (docs/reliability.md).
func TestFaultsOnCitus(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: starts a Citus cluster and kills two of its nodes, about 2 min")
	}
	lib, err := exec.Command("pg_config", "--pkglibdir").Output()
	require.NoError(t, err, "pg_config (postgresql-server-dev or libpq-dev) is needed to find Citus")
	_, err = os.Stat(filepath.Join(strings.TrimSpace(string(lib)), "citus.so"))
	require.NoError(t, err, "Citus is not installed for this PostgreSQL: run scripts/citus-cluster build (about 4 minutes; .ci/run does)")
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	c, adminURL, err := startCitus(ctx, 26368, &progress)
	if c != nil {
		t.Cleanup(c.stop)
	}
	require.NoError(t, err, "progress:\n%s", progress.String())
	out := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			logServerErrors(t, filepath.Join(out, "api.log"))
		}
	})
	res := runHeld(t, ctx, config{
		adminURL: adminURL, phase: 9 * time.Second, workers: 8,
		intentDeadline: 90 * time.Second, idleInTx: 2 * time.Second, out: out, citus: c,
	}, &progress)
	for _, p := range res.Phases[1:] {
		require.Equal(t, 1, p.Faults, "phase %q", p.Name)
		// The lost node was felt: some attempt met it.
		require.Positive(t, p.Replies["503 service-unavailable"]+p.Replies["503 outcome-unknown"]+p.Replies["no response"],
			"phase %q: %v", p.Name, p.Replies)
	}
	require.Positive(t, res.Payments)
	require.Positive(t, res.Refunds)
}

// runHeld runs the suite with cfg, logs its report, and requires every
// invariant to hold.
func runHeld(t *testing.T, ctx context.Context, cfg config, progress *bytes.Buffer) *Results {
	t.Helper()
	res, err := run(ctx, cfg, progress)
	require.NoError(t, err, "progress:\n%s", progress.String())
	var report bytes.Buffer
	writeReport(&report, res, false)
	t.Log("\n" + report.String())
	for _, c := range res.Invariants {
		require.True(t, c.Holds, "%s: %d", c.Name, c.Found)
	}
	return res
}

// logServerErrors logs the API's 500 answers, from its log, for a test
// that failed.
func logServerErrors(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Log(err)
		return
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"status":500`) {
			t.Log(line)
		}
	}
}

// The report a user reads in a 120-column terminal fits it, and its
// figures add up: answers, intents, and what became of each intent.
func TestReportFitsAndAddsUp(t *testing.T) {
	t.Parallel()
	res := &Results{
		Payments: 2843, Refunds: 858, Duration: 56 * time.Second,
		Unknown: 520, UnknownIntents: 419, UnknownCommitted: 223, UnknownNotCommitted: 186,
		Invariants: []check{{Name: "500 answers", Holds: true}},
	}
	for _, name := range []string{"no fault", "database refuses connections", "kill -9 of the primary's node"} {
		res.Phases = append(res.Phases, &phaseStats{
			Name: name, Faults: 1267, Intents: 10_095, Attempts: 14_440, UnknownThenReplayed: 140, UnknownThenExecuted: 60,
			LongestIntent: 5540 * time.Millisecond, LongestWithoutSuccess: 9240 * time.Millisecond, NoPrimary: 9300 * time.Millisecond,
			Replies: map[string]int{
				"201": 10_031, "409 payment-processing": 3533, "no response": 48, "422 refund-exceeds-payment": 7,
				"422 payment-not-refundable": 4, "201 replayed": 1, "503 outcome-unknown": 570, "503 service-unavailable": 1121,
				"409 idempotency-request-in-progress": 4,
			},
		})
	}
	var narrow, wide bytes.Buffer
	writeReport(&narrow, res, false)
	writeReport(&wide, res, true)
	t.Log("\n" + narrow.String())
	for _, line := range strings.Split(narrow.String(), "\n") {
		require.LessOrEqual(t, len(line), 120, "%q", line)
	}
	require.Contains(t, narrow.String(), "409 idempotency-request-in-progress: 4")
	require.Contains(t, narrow.String(), "520 outcome-unknown answers to 419 intents")
	require.Contains(t, narrow.String(), "\n223 had committed (replayed) and 186 had not (executed once); 10 got no final answer")
	require.Regexp(t, `held +201: 10031, 409 payment-processing: 3533`, wide.String())
}

// A reply that says "no effect" must be exactly those the contract says
// had none; an unknown outcome and no response at all are never that.
func TestNoEffectReplies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r        reply
		noEffect bool
		final    bool
	}{
		{reply{status: 201}, false, true},
		{reply{status: 201, replayed: true}, false, true},
		{reply{status: 422, problem: "refund-exceeds-payment"}, false, true},
		{reply{status: 422, problem: "payment-not-refundable"}, false, true},
		{reply{status: 409, problem: "payment-processing"}, true, false},
		{reply{status: 503, problem: "outcome-unknown"}, false, false},
		{reply{}, false, false},
		{reply{status: 503, problem: "service-unavailable"}, true, false},
		{reply{status: 409, problem: "idempotency-request-in-progress"}, true, false},
		{reply{status: 500, problem: "internal-error"}, true, false},
		{reply{status: 400, problem: "validation-failed"}, true, true},
	} {
		require.Equal(t, tc.noEffect, tc.r.noEffect(), tc.r.label())
		require.Equal(t, tc.final, tc.r.final(), tc.r.label())
	}
}
