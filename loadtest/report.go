package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func writeOutputs(dir string, res *Results) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(res)), 0o644); err != nil {
		return err
	}
	return plotClaims(filepath.Join(dir, "claim_p99.png"), res)
}

func report(res *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Load test report\n\nStarted %s. %s, %s.\n\n", res.StartedAt.Format(time.RFC3339), res.GoVersion, res.PostgresVersion)
	fmt.Fprintf(&b, "Machine: %s cores, %s memory, %s.\n\n", res.Machine["cpus"], res.Machine["memory"], res.Machine["cpu_model"])
	b.WriteString("Settings: ")
	for _, k := range sortedKeys(res.Settings) {
		fmt.Fprintf(&b, "`%s=%s` ", k, res.Settings[k])
	}
	b.WriteString("\n\n## Claim latency against key-table size\n\n")
	b.WriteString("| table rows | table | unique index | load | req/s | request p50 | p99 | p99.9 | claim p50 | claim p99 | replay p99 | replays | errors |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range res.Stages {
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f s | %.0f | %.2f ms | %.2f ms | %.2f ms | %.3f ms | %.3f ms | %.2f ms | %d | %s |\n",
			humanCount(s.TableRows), humanBytes(s.TableBytes), humanBytes(s.IndexBytes), s.LoadSeconds, s.RPS,
			s.RequestP50, s.RequestP99, s.RequestP999, s.ClaimP50, s.ClaimP99, s.ReplayP99, s.Replays, errorsString(s.Errors))
	}
	if n := len(res.Stages); n > 1 && res.Stages[0].ClaimP99 > 0 {
		fmt.Fprintf(&b, "\nClaim p99 at %s rows is %.2fx claim p99 at %s rows.\n", humanCount(res.Stages[n-1].TableRows),
			res.Stages[n-1].ClaimP99/res.Stages[0].ClaimP99, humanCount(res.Stages[0].TableRows))
	}
	b.WriteString("\n## Overhead, measured side by side\n\n| | req/s | ratio |\n|---|---:|---:|\n")
	fmt.Fprintf(&b, "| idempotent payment (first stage) | %.0f | |\n", res.IdempotentRPS)
	if res.BaselineRPS > 0 {
		fmt.Fprintf(&b, "| same payment without idempotency | %.0f | idempotent/baseline = **%.2f** |\n", res.BaselineRPS, res.OverheadRatio)
	}
	if res.PeerRPS > 0 {
		fmt.Fprintf(&b, "| peer: the same payment, key claimed in Redis | %.0f | ours/peer = **%.2f** (what it buys: docs/lab.md rows 3 and 5) |\n", res.PeerRPS, res.OursToPeer)
	}
	if res.PgbenchTPS > 0 {
		fmt.Fprintf(&b, "| pgbench, the service's SQL | %.0f | service/pgbench = **%.2f** |\n", res.PgbenchTPS, res.ServiceToPgbenchRatio)
		fmt.Fprintf(&b, "| pgbench, the same SQL without the outbox job | %.0f | with job/without = **%.2f** |\n", res.PgbenchWithoutJobTPS, res.PgbenchTPS/res.PgbenchWithoutJobTPS)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	fmt.Fprintf(&b, "\nThe API logged %d ERROR lines during the run (api.log).\n", res.APILogErrors)
	b.WriteString("\n## The outbox\n\nEvery payment inserts a charge job in its transaction; the service's workers call the processor (the in-process simulator, no latency) and record the answer.\n\n")
	b.WriteString("| table rows | payments/s | charges completed/s | jobs not done at stage end | oldest waiting job |\n|---:|---:|---:|---:|---:|\n")
	for _, s := range res.Stages {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %d | %.2f s |\n", humanCount(s.TableRows), s.RPS, s.OutboxCompletedPerSec, s.OutboxBacklog, s.OutboxLagSeconds)
	}
	fmt.Fprintf(&b, "\nThe outbox was empty %.1f s after the last stage. The job insert's cost to the database is the pgbench pair above; `go test -bench Outbox ./internal/payments` measures it for the payment write alone (docs/external-effects.md).\n", res.OutboxDrainSeconds)
	b.WriteString("\n## PostgreSQL settings\n\n")
	for _, k := range sortedKeys(res.PostgresSettings) {
		fmt.Fprintf(&b, "- `%s` = %s\n", k, res.PostgresSettings[k])
	}
	b.WriteString("\nClaim times come from the server's `Server-Timing: claim` header (the claim statement alone); request times are measured by the client from the intended send time. Percentiles are exact, over every sample.\n")
	return b.String()
}

func plotClaims(path string, res *Results) error {
	p := plot.New()
	p.Title.Text = "p99 latency against key-table size"
	p.X.Label.Text = "rows in idempotency_keys (+1, log scale)"
	p.Y.Label.Text = "milliseconds"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	var claim, claim50, request plotter.XYs
	for _, s := range res.Stages {
		x := float64(s.TableRows + 1)
		claim = append(claim, plotter.XY{X: x, Y: s.ClaimP99})
		claim50 = append(claim50, plotter.XY{X: x, Y: s.ClaimP50})
		request = append(request, plotter.XY{X: x, Y: s.RequestP99})
	}
	if err := plotutil.AddLinePoints(p, "request p99 (client)", request, "claim p99 (server)", claim, "claim p50 (server)", claim50); err != nil {
		return err
	}
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(50)
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func (c config) describe() map[string]string {
	sizes := make([]string, len(c.sizes))
	for i, s := range c.sizes {
		sizes[i] = strconv.FormatInt(s, 10)
	}
	return map[string]string{
		"sizes": strings.Join(sizes, ","), "duration": c.duration.String(), "warmup": c.warmup.String(),
		"concurrency": strconv.Itoa(c.concurrency), "rate": strconv.FormatFloat(c.rate, 'f', -1, 64),
		"replay_fraction": strconv.FormatFloat(c.replayFraction, 'f', -1, 64), "principals": strconv.Itoa(c.principals),
	}
}

func machineInfo() map[string]string {
	m := map[string]string{"os": runtime.GOOS, "arch": runtime.GOARCH, "cpus": strconv.Itoa(runtime.NumCPU())}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu_model"] = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				m["memory"] = humanBytes(kb * 1024)
			}
		}
		f.Close()
	}
	return m
}

func waitReady(ctx context.Context, base string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errNotReady
}

func humanCount(n int64) string {
	switch {
	case n >= 1_000_000:
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "M"
	case n >= 10_000:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 0, 64) + "k"
	default:
		return strconv.FormatInt(n, 10)
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

func errorsString(e map[string]int) string {
	if len(e) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range sortedKeys(e) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, e[k]))
	}
	return strings.Join(parts, ", ")
}
