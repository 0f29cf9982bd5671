package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// A smoke test of the curve: two tiny sizes per key shape, so the pipeline
// (fill, measure in windows, summarize, report, plot) cannot rot unnoticed.
// It proves no number.
func TestCurveSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: a small curve, about 20 s; the full test command (and CI) runs it")
	}
	const concurrency, apiConns, outboxConns = 4, 6, 2
	db := testdb.New(t, adminConns+apiConns+outboxConns+2)
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-curve", "-sizes", "0,3000", "-duration", "2s", "-windows", "2", "-warmup", "200ms", "-rate", "100",
		"-concurrency", strconv.Itoa(concurrency), "-principals", "3", "-db-max-conns", strconv.Itoa(apiConns), "-outbox-db-max-conns", strconv.Itoa(outboxConns),
		"-processor-latency", "20ms", "-database-url", db.AdminURL, "-out", out, "-take-over"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	require.NoError(t, runCurve(ctx, cfg, &progress), "progress: %s", progress.String())

	var cv Curve
	raw, err := os.ReadFile(filepath.Join(out, "curve.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &cv))
	require.Len(t, cv.Points, 4, "two sizes for each of two key shapes")
	for i, p := range cv.Points {
		require.Equal(t, []string{keyShapeRandom, keyShapeTimeOrdered}[i/2], p.KeyShape)
		require.Len(t, p.Windows, 2)
		require.Positive(t, p.ClaimP99)
		require.LessOrEqual(t, p.ClaimP99Min, p.ClaimP99Max)
		require.Positive(t, p.WALBytesPerPayment)
		require.Positive(t, p.IndexBytes)
		require.Empty(t, p.Errors)
	}
	require.GreaterOrEqual(t, cv.Points[1].TableRows, int64(3000), "the second size was filled before it was measured")
	require.Positive(t, cv.IndexBytesPerRow)
	require.Positive(t, cv.PredictedKneeRows, "set against the machine's memory without a limit")
	require.Equal(t, int64(100*86400), cv.SteadyRows)
	require.NotEmpty(t, cv.Findings)
	for _, f := range []string{"curve.md", "curve.png"} {
		info, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
		require.Positive(t, info.Size())
	}

	// The time-ordered table's bulk rows are UUIDv7 whose order is their
	// creation's: a client's new key sorts after all of them.
	conn, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT key FROM idempotency_keys WHERE correlation_id LIKE 'bulk\_%' ORDER BY created_at`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Greater(t, len(keys), 2000, "the bulk load tops the first size's rows up to 3000")
	for i, k := range keys {
		u, err := uuid.Parse(k)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), u.Version(), k)
		if i > 0 {
			require.GreaterOrEqual(t, k[:13], keys[i-1][:13], "the millisecond prefix follows created_at")
		}
	}
	require.Greater(t, uuid.Must(uuid.NewV7()).String(), keys[len(keys)-1])
}

// A curve that began on a busy machine judges nothing, says so in its
// report and carries the banner; a quiet one is judged.
func TestABusyCurveJudgesNothing(t *testing.T) {
	t.Parallel()
	points := func() []Point {
		var ps []Point
		for i, rows := range []int64{0, 1_000_000, 4_000_000} {
			ps = append(ps, Point{KeyShape: keyShapeRandom, TableRows: rows, TableRowsEnd: rows + 1000, IndexBytes: rows * 120, ClaimP99: []float64{1, 1.1, 3}[i]})
			ps = append(ps, Point{KeyShape: keyShapeTimeOrdered, TableRows: rows, TableRowsEnd: rows + 1000, IndexBytes: rows * 100, ClaimP99: 1})
		}
		return ps
	}
	quiet := &Curve{Points: points(), Cores: 2, LoadBefore: 0.5, MemoryLimit: 256 << 20, Memory: 256 << 20, SweepRate: 100}
	quiet.summarize()
	report := curveReport(quiet)
	require.Contains(t, report, "| met |")
	require.NotContains(t, report, "BUSY")
	require.InDelta(t, 2_236_962, quiet.PredictedKneeRows, 1000, "256 MiB / 120 B per row")

	busy := &Curve{Points: points(), Cores: 2, LoadBefore: 3.8, Busy: true, MemoryLimit: 256 << 20, Memory: 256 << 20, SweepRate: 100}
	busy.summarize()
	report = curveReport(busy)
	require.Contains(t, report, "**BUSY MACHINE (load 3.8 on 2 cores): not a finding.**")
	require.NotContains(t, report, "| met |")
	require.NotContains(t, report, "| missed |")
	require.Contains(t, report, "not judged: the machine was busy")
}

// scripts/limited-postgres starts a PostgreSQL whose every process is in a
// memory cgroup with the limit asked for, and removes it all again.
func TestLimitedPostgres(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a memory cgroup is written as root; CI runs as root")
	}
	if testing.Short() {
		t.Skip("-short skips it: an initdb, about 5 s")
	}
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	script := filepath.Join(root, limitedScript)
	env := append(os.Environ(), "LIMITED_DIR="+filepath.Join(os.TempDir(), "limited-postgres-test-"+strconv.Itoa(os.Getpid())), "LIMITED_PORT=26349")
	do := func(verb string, extra ...string) string {
		cmd := exec.Command(script, verb)
		cmd.Env = append(env, extra...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", verb, out)
		return strings.TrimSpace(string(out))
	}
	t.Cleanup(func() { do("down") })
	do("up", "MEMORY=200MB")
	usage := strings.Fields(do("usage"))
	require.Equal(t, []string{"limit", strconv.Itoa(200 << 20)}, usage[:2])
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, do("url"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var pid int
	var sb string
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid(), current_setting('shared_buffers')`).Scan(&pid, &sb))
	require.Equal(t, "25MB", sb, "an eighth of the limit")
	cg, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	require.NoError(t, err)
	require.Contains(t, string(cg), "payments-limited-postgres-26349", "the backend serving this connection is in the group")
}
