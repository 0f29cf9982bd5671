package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A smoke test of the load test itself: tiny sizes and a couple of seconds,
// so it cannot rot unnoticed. It proves the pipeline works (build, start,
// bulk load, drive, baseline, pgbench, report), not any number.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: a small load test, about 35 s; the full test command (and CI) runs it")
	}
	const concurrency, apiConns, outboxConns = 4, 6, 2
	// The load test's own pool, the API's pool, its outbox's, its webhook
	// deliveries' (WEBHOOK_DB_MAX_CONNS's default, 4) and its maintenance
	// pool of 2, and pgbench's clients, one per -concurrency.
	db := testdb.New(t, adminConns+apiConns+outboxConns+4+2+concurrency)
	out := t.TempDir()
	cfg, err := parseFlags([]string{
		"-sizes", "0,3000", "-duration", "1500ms", "-warmup", "200ms", "-repeats", "2", "-compare-duration", "1s", "-concurrency", strconv.Itoa(concurrency), "-principals", "3",
		"-db-max-conns", strconv.Itoa(apiConns), "-outbox-db-max-conns", strconv.Itoa(outboxConns), "-processor-latency", "20ms,60ms", "-database-url", db.AdminURL, "-out", out, "-take-over",
		"-webhook-latency", "20ms",
	})
	require.NoError(t, err)
	// The API's own log explains a failed stage; the output directory is
	// removed with the test, so show it here.
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(out, "api.log")); err == nil {
				t.Logf("api.log:\n%s", log)
			}
		}
	})
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := run(ctx, cfg, &progress)
	require.NoError(t, err, "progress: %s", progress.String())

	require.Len(t, res.Stages, 2)
	// Stage boundaries cancel no request: the server logged no error.
	apiLog, err := os.ReadFile(filepath.Join(out, "api.log"))
	require.NoError(t, err)
	require.NotContains(t, string(apiLog), `"level":"ERROR"`)
	require.Zero(t, res.APILogErrors)
	require.GreaterOrEqual(t, res.Stages[1].TableRows, int64(3000))
	for _, s := range res.Stages {
		require.Positive(t, s.Requests)
		require.Positive(t, s.RequestP99)
		require.Positive(t, s.ClaimP99, "Server-Timing was read")
		require.Positive(t, s.OutboxCompletedPerSec, "the outbox workers charged payments")
		require.Positive(t, s.ChargesAccepted)
		require.Positive(t, s.ChargedToAccepted)
		require.GreaterOrEqual(t, s.ChargeLagP50, 0.020, "a charge waits at least the processor's latency")
		require.GreaterOrEqual(t, s.ChargeLagP99, s.ChargeLagP50)
		require.NotEmpty(t, s.Timeline)
		var accepted int64
		for _, sec := range s.Timeline {
			accepted += sec.Accepted
		}
		require.Equal(t, s.ChargesAccepted, accepted, "the timeline counts every payment of the run")
		require.Empty(t, s.Errors)
		require.Positive(t, s.Updates, "the completions were counted")
		require.Positive(t, s.ReplayOnlyRPS, "the replays-alone run ran")
		require.Positive(t, s.ReplayToNewRPS)
		require.Positive(t, s.WALBytesPerRequest, "new payments write WAL")
		require.Positive(t, s.CPUPerRequestMs, "the API's CPU per request was read from its metrics")
		require.Positive(t, s.AllocsPerRequest)
		require.Positive(t, s.ReplayCPUPerRequestMs)
		require.Positive(t, s.ReplayAllocsPerRequest)
		require.Positive(t, s.Deliveries, "every principal's endpoint got its payments' events")
		require.Zero(t, s.DeliveriesLeft)
		require.GreaterOrEqual(t, s.DeliveryLagP50, 0.020, "a delivery waits at least the receiver's latency")
	}
	require.NotNil(t, res.CPUProfile, "notes: %v", res.Notes)
	require.Positive(t, res.CPUProfile.CPUSeconds)
	require.Positive(t, res.CPUProfile.CPUPerRequestMs)
	require.NotEmpty(t, res.CPUProfile.ByArea)
	require.Positive(t, res.BaselineRPS)
	require.Positive(t, res.PeerRPS, "the Redis-claim peer ran")
	require.Positive(t, res.OverheadRatio)
	if res.PgbenchTPS == 0 {
		require.NotEmpty(t, res.Notes, "pgbench skipped without saying why")
	} else {
		require.Positive(t, res.PgbenchWithoutJobTPS)
		require.Len(t, res.Comparisons, 4, "baseline, replay, peer and pgbench")
		for _, c := range res.Comparisons {
			require.Len(t, c.Ratios, 2, "%s: one ratio per round", c.Name)
		}
	}

	raw, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(raw, &fields))
	for _, k := range []string{"stages", "comparisons", "baseline_rps", "peer_redis_claim_rps", "ours_to_peer_ratio", "idempotent_rps", "overhead_ratio", "pgbench_tps", "pgbench_without_job_tps", "service_to_pgbench_ratio",
		"machine", "go_version", "postgres_version", "postgres_settings", "api_log_errors", "cpu_profile", "load_before", "cores", "noisy"} {
		require.Contains(t, fields, k)
	}
	stage := fields["stages"].([]any)[0].(map[string]any)
	for _, k := range []string{"table_rows", "table_bytes", "index_bytes", "rps", "request_p50_ms", "request_p99_ms",
		"claim_p50_ms", "claim_p99_ms", "replay_p99_ms", "errors", "outbox_completed_per_sec", "outbox_backlog", "outbox_drain_seconds",
		"charges_accepted", "charged_to_accepted", "charge_lag_p50_s", "charge_lag_p99_s", "peak_backlog", "timeline", "charges_left",
		"updates", "hot_updates", "hot_ratio", "wal_bytes_per_request", "replay_wal_bytes_per_request", "replay_only_rps", "replay_only_p99_ms", "replay_to_new_rps", "replay_to_new_p99"} {
		require.Contains(t, stage, k)
	}
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(report), "With deliveries running")
	for _, f := range []string{"report.md", "latency.png", "outbox.png"} {
		info, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
		require.Positive(t, info.Size())
	}
}

func TestOnlyLoopbackTargets(t *testing.T) {
	t.Parallel()
	require.NoError(t, requireLoopback("http://127.0.0.1:8080"))
	require.NoError(t, requireLoopback("http://localhost:8080"))
	require.NoError(t, requireLoopback("postgres://u@[::1]:5432/db"))
	require.Error(t, requireLoopback("http://10.0.0.5:8080"))
	require.Error(t, requireLoopback("http://example.com"))
	_, err := run(context.Background(), config{databaseURL: "postgres://u@192.168.1.10/db", out: t.TempDir()}, &bytes.Buffer{})
	require.ErrorContains(t, err, "loopback")
}

func TestPercentileIsExact(t *testing.T) {
	t.Parallel()
	xs := make([]float64, 1000)
	for i := range xs {
		xs[i] = float64(1000 - i) // 1000..1
	}
	require.Equal(t, 500.0, percentile(xs, 0.50))
	require.Equal(t, 990.0, percentile(xs, 0.99))
	require.Equal(t, 999.0, percentile(xs, 0.999))
	require.Equal(t, 0.0, percentile(nil, 0.99))
}

func TestServerTimingParse(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1234*time.Microsecond, serverTimingClaim("claim;dur=1.234"))
	require.Equal(t, 2*time.Millisecond, serverTimingClaim("db;dur=9, claim;dur=2.000"))
	require.Equal(t, time.Duration(-1), serverTimingClaim(""))
}

// The load test empties its database: it refuses one it did not create (or
// was not told to take over), and says so, before touching anything.
func TestRefusesADatabaseItDidNotCreate(t *testing.T) {
	db := testdb.New(t, 2)
	cfg, err := parseFlags([]string{"-database-url", db.AdminURL, "-out", t.TempDir(), "-redis-peer", ""})
	require.NoError(t, err)
	_, err = run(context.Background(), cfg, &bytes.Buffer{})
	require.ErrorIs(t, err, errNotOurs)
	require.Contains(t, err.Error(), "-take-over")
}

// The plot's labels: one format per axis, sizes as people say them.
func TestPlotLabels(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 2540: "2.5k", 100_000: "100k", 1_002_620: "1M", 10_000_000: "10M", 12_500_000: "13M"} {
		require.Equal(t, want, formatRows(n), "%d rows", n)
	}
	for _, r := range [][2]float64{{0, 16}, {0, 4}, {0, 0.8}, {0, 70}} {
		decimals := -1
		for _, tick := range (msTicks{}).Ticks(r[0], r[1]) {
			if tick.Label == "" {
				continue
			}
			d := 0
			if i := strings.IndexByte(tick.Label, '.'); i >= 0 {
				d = len(tick.Label) - i - 1
			}
			if decimals == -1 {
				decimals = d
			}
			require.Equal(t, decimals, d, "axis %v: tick %q", r, tick.Label)
		}
	}
}

// The CPU profile's areas: a standard library method is not "other".
func TestAreaOf(t *testing.T) {
	t.Parallel()
	for fn, want := range map[string]string{
		"sync.(*Mutex).Lock":                      "Go standard library, other",
		"net/textproto.(*Reader).ReadLine":        "net/http",
		"internal/poll.(*FD).Write":               "network",
		"context.(*cancelCtx).Done":               "Go standard library, other",
		"github.com/jackc/pgx/v5.(*Conn).Query":   "pgx (PostgreSQL driver)",
		"github.com/google/uuid.NewString":        "other",
		"main.run":                                "this service",
		"internal/runtime/syscall/linux.Syscall6": "syscalls",
		"gopkg.in/yaml.v3.(*parser).parse":        "other",
		"runtime.mallocgc":                        "allocation",
	} {
		require.Equal(t, want, areaOf(fn), fn)
	}
}

// Off a terminal, progress is plain lines: a redirected log is readable.
func TestProgressOffATerminalIsPlainLines(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	p := plainLines{&b}
	fmt.Fprintf(p, "\rstage 1/2, 0 rows:  1s/15s     567 req/s  errors 0   ")
	fmt.Fprintf(p, "\rstage 1/2, 0 rows: warming up%30s", "")
	fmt.Fprintf(p, "\rstage 1/2: 620 req/s\n")
	fmt.Fprintln(p, "preparing the database")
	require.Equal(t, "stage 1/2, 0 rows:  1s/15s     567 req/s  errors 0\nstage 1/2, 0 rows: warming up\nstage 1/2: 620 req/s\npreparing the database\n", b.String())
	require.NotContains(t, b.String(), "\r")
}

// A run that began on a busy machine says its ratios are not findings.
func TestANoisyRunReportsNoFindings(t *testing.T) {
	t.Parallel()
	res := &Results{BaselineRPS: 500, IdempotentRPS: 565, OverheadRatio: 1.13, Cores: 2}
	require.NotContains(t, report(res), "Not findings")
	c := Comparison{Name: "idempotent/baseline", Target: 0.85}
	c.add(90, 100)
	res.Comparisons = []Comparison{c}
	res.Stages = []Stage{{TableRows: 1694, ClaimP99: 31.2}, {TableRows: 202_000, ClaimP99: 18.4}}
	require.Contains(t, report(res), "**met**")
	require.Contains(t, report(res), "Claim p99 at 202k rows is 0.59x")
	res.LoadBefore, res.Noisy = 9.3, true
	busy := report(res)
	require.Contains(t, busy, "**Not findings: the machine was busy with other work when the run began (load average 9.3 on 2 cores)")
	require.Contains(t, busy, "**BUSY MACHINE (load 9.3 on 2 cores): not a finding.**")
	require.NotContains(t, busy, "**met**", "no verdict on a busy machine")
	require.Contains(t, busy, "not judged (busy machine)")
	require.NotContains(t, busy, "0.59x", "no ratio stated as a finding")
	require.NotContains(t, busy, "map[")
}

func TestParseLatency(t *testing.T) {
	t.Parallel()
	m, p, err := parseLatency("300ms,800ms")
	require.NoError(t, err)
	require.Equal(t, []time.Duration{300 * time.Millisecond, 800 * time.Millisecond}, []time.Duration{m, p})
	m, p, err = parseLatency("300ms")
	require.NoError(t, err)
	require.Equal(t, []time.Duration{300 * time.Millisecond, 0}, []time.Duration{m, p})
	for _, bad := range []string{"", "fast", "300ms,100ms", "-1s", "300ms,"} {
		_, _, err := parseLatency(bad)
		require.Error(t, err, bad)
	}
}

// A ratio whose rounds straddle its target is unresolved, not met or missed.
func TestComparisonVerdict(t *testing.T) {
	t.Parallel()
	c := Comparison{Name: "x", Target: 0.85}
	c.add(90, 100)
	require.Equal(t, "met", c.Verdict)
	c.add(80, 100)
	require.Equal(t, "unresolved", c.Verdict)
	c.add(70, 100)
	require.Equal(t, []float64{0.8, 0.7, 0.9}, []float64{c.Median, c.Min, c.Max})
	m := Comparison{Name: "y", Target: 0.85}
	m.add(50, 100)
	m.add(60, 100)
	require.Equal(t, "missed", m.Verdict)
	require.InDelta(t, 0.55, m.Median, 1e-9, "the median of an even count is the mean of the middle two")
}
