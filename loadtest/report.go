package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
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
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// replot redraws dir's report and plot from its results.json, after a
// change to how they are drawn.
func replot(dir string) error {
	if raw, err := os.ReadFile(filepath.Join(dir, "curve.json")); err == nil {
		var cv Curve
		if err := json.Unmarshal(raw, &cv); err != nil {
			return fmt.Errorf("%s/curve.json: %w", dir, err)
		}
		return writeCurve(dir, &cv)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var res Results
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("%s/results.json: %w", dir, err)
	}
	if res.CPUProfile != nil {
		if err := resummarize(context.Background(), dir, res.CPUProfile); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(&res)), 0o644); err != nil {
		return err
	}
	if err := plotLatency(filepath.Join(dir, "latency.png"), &res); err != nil {
		return err
	}
	return plotOutbox(filepath.Join(dir, "outbox.png"), &res)
}

func writeOutputs(dir string, res *Results) error {
	if err := writeJSON(filepath.Join(dir, "results.json"), res); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(res)), 0o644); err != nil {
		return err
	}
	if err := plotLatency(filepath.Join(dir, "latency.png"), res); err != nil {
		return err
	}
	return plotOutbox(filepath.Join(dir, "outbox.png"), res)
}

// orDefault is v, or def when v is empty (a results.json from before the
// setting existed).
func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// latencyWords says how the processor answered.
func latencyWords(settings map[string]string) string {
	median, p99 := settings["processor_latency"], settings["processor_latency_p99"]
	switch {
	case median == "" || median == "0s":
		return "no latency"
	case p99 == "" || p99 == "0s":
		return median + " latency"
	default:
		return fmt.Sprintf("latency log-normal, median %s, p99 %s", median, p99)
	}
}

// plotOutbox draws, per stage, payments accepted and charged per second
// through the measured run and the drain after it (left), and the backlog
// (right).
func plotOutbox(path string, res *Results) error {
	var rows [][]*plot.Plot
	for _, s := range res.Stages {
		if len(s.Timeline) == 0 {
			continue
		}
		var accepted, charged, backlog plotter.XYs
		for _, sec := range s.Timeline {
			x := float64(sec.T)
			accepted = append(accepted, plotter.XY{X: x, Y: float64(sec.Accepted)})
			charged = append(charged, plotter.XY{X: x, Y: float64(sec.Charged)})
			backlog = append(backlog, plotter.XY{X: x, Y: float64(sec.Backlog)})
		}
		rate := plot.New()
		rate.Title.Text = fmt.Sprintf("%s rows: payments per second", humanCount(s.TableRows))
		if res.Noisy {
			bannerTitle(rate, res.LoadBefore, res.Cores)
		}
		rate.X.Label.Text = "seconds since the run began (the drain follows it)"
		if err := plotutil.AddLines(rate, "accepted", accepted, "charged", charged); err != nil {
			return err
		}
		rate.Legend.Top = true
		rate.Y.Min = 0
		queue := plot.New()
		queue.Title.Text = "backlog (jobs accepted, not charged)"
		queue.X.Label.Text = rate.X.Label.Text
		if err := plotutil.AddLines(queue, "backlog", backlog); err != nil {
			return err
		}
		queue.Y.Min = 0
		rows = append(rows, []*plot.Plot{rate, queue})
	}
	if len(rows) == 0 {
		return nil
	}
	return writePNG(path, rows, 9*vg.Inch, vg.Length(len(rows))*3*vg.Inch)
}

// writePNG draws rows of panels, two to a row, aligned, into a PNG of w x h.
func writePNG(path string, rows [][]*plot.Plot, w, h vg.Length) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(144))
	tiles := draw.Tiles{Rows: len(rows), Cols: 2, PadX: vg.Millimeter * 8, PadY: vg.Millimeter * 8, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(rows, tiles, draw.New(img))
	for i := range rows {
		for j := range rows[i] {
			rows[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeJSON writes v, indented, to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
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
	if res.Noisy {
		fmt.Fprintf(&b, "**%s.** Every figure below shared the machine with other work.\n\n", busyBanner(res.LoadBefore, res.Cores))
	}
	b.WriteString("Rows measured at: the table's rows when the measured run began (a stage's warm-up adds some to the size asked for). Bulk load: the seconds spent filling the table before the stage. For the curve of claim p99 against size, with the knee where the index leaves memory, run `go run ./loadtest -curve` (curve.md).\n\n")
	b.WriteString("| rows measured at | table | unique index | bulk load | req/s | request p50 | p99 | p99.9 | claim p50 | claim p99 | replay p99 | replays | errors |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range res.Stages {
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f s | %.0f | %.2f ms | %.2f ms | %.2f ms | %.3f ms | %.3f ms | %.2f ms | %d | %s |\n",
			humanCount(s.TableRows), humanBytes(s.TableBytes), humanBytes(s.IndexBytes), s.LoadSeconds, s.RPS,
			s.RequestP50, s.RequestP99, s.RequestP999, s.ClaimP50, s.ClaimP99, s.ReplayP99, s.Replays, errorsString(s.Errors))
	}
	b.WriteString("\n## Completions and replays\n\n")
	b.WriteString("HOT: the completion's UPDATE of idempotency_keys touched no index and stayed on its page. Replays alone: a run of nothing but retries of keys the stage stored, right after it.\n\n")
	b.WriteString("| table rows | completions | HOT | HOT ratio | WAL per request | replays alone req/s | p50 | p99 | WAL per replay | replay/new req/s | replay/new p99 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range res.Stages {
		// A new payment always writes WAL: 0 means a results.json from before
		// the load test measured it, which -replot must not show as a figure.
		wal, replayWAL := "not measured", "not measured"
		if s.WALBytesPerRequest > 0 {
			wal, replayWAL = fmt.Sprintf("%.0f B", s.WALBytesPerRequest), fmt.Sprintf("%.0f B", s.ReplayWALBytesPerRequest)
		}
		if s.WALCompression != "" {
			wal += " (wal_compression " + s.WALCompression + ")"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f %% | %s | %.0f | %.2f ms | %.2f ms | %s | **%.2f** | **%.2f** |\n", humanCount(s.TableRows), s.Updates, s.HotUpdates, 100*s.HotRatio,
			wal, s.ReplayOnlyRPS, s.ReplayOnlyP50, s.ReplayOnlyP99, replayWAL, s.ReplayToNewRPS, s.ReplayToNewP99)
	}
	if len(res.Stages) > 0 && res.Stages[0].CPUPerRequestMs > 0 {
		b.WriteString("\n## What a request costs\n\nFigures that do not depend on how busy the machine was: the API process's CPU (`process_cpu_seconds_total`) and heap allocations (`go_memstats_mallocs_total`) per request, and the WAL the database wrote per request, over each run. A new payment's figures include its share of the outbox workers, which charge in the same process during the run; a replay's do not (no charge follows it). Round trips per request are counted by `TestRoundTripsPerRequest` (internal/httpapi).\n\n")
		b.WriteString("| table rows | new payment: API CPU | allocations | WAL | replay: API CPU | allocations | WAL |\n|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range res.Stages {
			fmt.Fprintf(&b, "| %s | %.3f ms | %.0f | %.0f B | %.3f ms | %.0f | %.0f B |\n", humanCount(s.TableRows), s.CPUPerRequestMs, s.AllocsPerRequest, s.WALBytesPerRequest,
				s.ReplayCPUPerRequestMs, s.ReplayAllocsPerRequest, s.ReplayWALBytesPerRequest)
		}
	}
	if n := len(res.Stages); n > 1 && res.Stages[0].ClaimP99 > 0 && !res.Noisy {
		fmt.Fprintf(&b, "\nClaim p99 at %s rows is %.2fx claim p99 at %s rows.\n", humanCount(res.Stages[n-1].TableRows),
			res.Stages[n-1].ClaimP99/res.Stages[0].ClaimP99, humanCount(res.Stages[0].TableRows))
	}
	b.WriteString("\n## Overhead, measured side by side\n\n")
	if res.Noisy {
		fmt.Fprintf(&b, "**Not findings: the machine was busy with other work when the run began (load average %.1f on %d cores).** Run it again on a quiet machine.\n\n", res.LoadBefore, res.Cores)
	} else if res.Cores > 0 {
		fmt.Fprintf(&b, "The machine was quiet when the run began (load average %.1f on %d cores); the load generator, the API and PostgreSQL share it.\n\n", res.LoadBefore, res.Cores)
	}
	if len(res.Comparisons) > 0 {
		fmt.Fprintf(&b, "At the first stage's size, in %s interleaved rounds of %s per design (ours, then each other design, round after round). A ratio is met or missed only when every round is on the same side of its target; otherwise it is unresolved.\n\n",
			orDefault(res.Settings["repeats"], "?"), orDefault(res.Settings["compare_duration"], "?"))
		b.WriteString("| ratio | median | range | per round (ours / theirs) | target |\n|---|---:|---:|---|---|\n")
		for _, c := range res.Comparisons {
			var rounds []string
			for i := range c.Ratios {
				rounds = append(rounds, fmt.Sprintf("%.0f / %.0f", c.Ours[i], c.Theirs[i]))
			}
			target := ""
			switch {
			case c.Target > 0 && res.Noisy:
				target = fmt.Sprintf("%.2f: not judged (busy machine)", c.Target)
			case c.Target > 0:
				target = fmt.Sprintf("%.2f: **%s**", c.Target, c.Verdict)
			}
			fmt.Fprintf(&b, "| %s | **%.2f** | %.2f-%.2f | %s | %s |\n", c.Name, c.Median, c.Min, c.Max, strings.Join(rounds, ", "), target)
		}
		if res.PgbenchWithoutJobTPS > 0 {
			fmt.Fprintf(&b, "\npgbench, the same SQL without the outbox job: %.0f tps (median), so the job costs the database %.0f %% of that write's throughput.\n", res.PgbenchWithoutJobTPS, 100*(1-res.PgbenchTPS/res.PgbenchWithoutJobTPS))
		}
	} else {
		b.WriteString("| | req/s | ratio |\n|---|---:|---:|\n")
		fmt.Fprintf(&b, "| idempotent payment (first stage) | %.0f | |\n", res.IdempotentRPS)
		if res.BaselineRPS > 0 {
			fmt.Fprintf(&b, "| same payment without idempotency | %.0f | idempotent/baseline = **%.2f** |\n", res.BaselineRPS, res.OverheadRatio)
		}
		if res.PeerRPS > 0 {
			fmt.Fprintf(&b, "| peer: the same payment, key claimed in Redis | %.0f | ours/peer = **%.2f** |\n", res.PeerRPS, res.OursToPeer)
		}
		if res.PgbenchTPS > 0 {
			fmt.Fprintf(&b, "| pgbench, the service's SQL | %.0f | service/pgbench = **%.2f** |\n", res.PgbenchTPS, res.ServiceToPgbenchRatio)
		}
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	fmt.Fprintf(&b, "\nThe API logged %d ERROR lines during the run (api.log).\n", res.APILogErrors)
	b.WriteString("\n## The outbox\n\n")
	fmt.Fprintf(&b, "Every payment inserts a charge job in its transaction; the service's %s outbox workers call the processor (the in-process simulator, %s) and record the answer. Charge lag: the payment's commit to its outcome's, over the run's charges (river_job: finalized_at - created_at). outbox.png shows payments accepted and charged per second, and the backlog, through each run and the drain after it.\n\n",
		orDefault(res.Settings["outbox_workers"], "default"), latencyWords(res.Settings))
	b.WriteString("| rows measured at | payments/s | charged/s | charged/accepted | charge lag p50 | p99 | peak backlog | left at run end | drained after | not charged after the drain | |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range res.Stages {
		behind := ""
		if s.fellBehind() {
			behind = "**the outbox fell behind**"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | **%.2f** | %.2f s | **%.2f s** | %d | %d | %.1f s | %d | %s |\n", humanCount(s.TableRows), s.RPS, s.OutboxCompletedPerSec, s.ChargedToAccepted,
			s.ChargeLagP50, s.ChargeLagP99, s.PeakBacklog, s.OutboxBacklog, s.OutboxDrainSeconds, s.ChargesLeft, behind)
	}
	if lat := res.Settings["webhook_latency"]; lat != "" && lat != "0s" {
		fmt.Fprintf(&b, "\nWith deliveries running: every principal has a webhook endpoint for its payments' outcomes, at a loopback receiver that answers after %s, so each charge's event is delivered during the run, by the webhook workers, in their own queue (docs/webhooks.md). Delivery lag: the event's commit to the delivery's record.\n\n", lat)
		b.WriteString("| rows measured at | deliveries | delivery lag p50 | p99 | left at run end | not delivered after the drain |\n|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range res.Stages {
			fmt.Fprintf(&b, "| %s | %d | %.2f s | %.2f s | %d | %d |\n", humanCount(s.TableRows), s.Deliveries, s.DeliveryLagP50, s.DeliveryLagP99, s.DeliveryBacklog, s.DeliveriesLeft)
		}
	}
	fmt.Fprintf(&b, "\nEach stage's backlog is drained (for at most %s; what is left is counted, and its charges are missing from the lag) before its replays-alone run, so every measured run starts with the outbox empty. The job insert's cost to the database is the pgbench pair above; `go test -bench Outbox ./internal/payments` measures it for the payment write alone (docs/external-effects.md).\n", orDefault(res.Settings["drain"], "5m"))
	if p := res.CPUProfile; p != nil {
		fmt.Fprintf(&b, "\n## Where the API's CPU goes\n\nA %.0f s CPU profile of the API during the first stage's measured run (cpu.pprof): %.1f s of CPU, **%.2f ms of CPU per request**.\n\n", p.Seconds, p.CPUSeconds, p.CPUPerRequestMs)
		b.WriteString("| area | share of CPU |\n|---|---:|\n")
		for _, a := range profileAreas(p) {
			fmt.Fprintf(&b, "| %s | %.1f %% |\n", a, p.ByArea[a])
		}
		b.WriteString("\nThe functions with the most CPU of their own (`go tool pprof -top cpu.pprof`):\n\n```\n")
		for _, l := range p.Top {
			b.WriteString(l + "\n")
		}
		b.WriteString("```\n")
	}
	b.WriteString("\n## PostgreSQL settings\n\n")
	for _, k := range sortedKeys(res.PostgresSettings) {
		fmt.Fprintf(&b, "- `%s` = %s\n", k, res.PostgresSettings[k])
	}
	b.WriteString("\nClaim times come from the server's `Server-Timing: claim` header (the claim statement alone); request times are measured by the client from the intended send time. Percentiles are exact, over every sample.\n")
	return b.String()
}

// plotLatency draws latency against the key table's size in two panels with
// axes of their own: the claim statement (from Server-Timing) and the whole
// request (from the client). On one axis the request's tens of milliseconds
// flatten the claim's few into a line along zero. Every point is labelled
// with its value, so the growth from the first one reads without a ruler.
func plotLatency(path string, res *Results) error {
	claim, err := latencyPanel("Claim statement (server), ms", res, func(s Stage) (float64, float64) { return s.ClaimP50, s.ClaimP99 })
	if err != nil {
		return err
	}
	request, err := latencyPanel("Whole request (client), ms", res, func(s Stage) (float64, float64) { return s.RequestP50, s.RequestP99 })
	if err != nil {
		return err
	}
	if res.Noisy {
		bannerTitle(claim, res.LoadBefore, res.Cores)
		bannerTitle(request, res.LoadBefore, res.Cores)
	}
	return writePNG(path, [][]*plot.Plot{{claim, request}}, 9*vg.Inch, 3.6*vg.Inch)
}

// latencyPanel plots p50 and p99 of one latency against table rows.
func latencyPanel(title string, res *Results, pick func(Stage) (p50, p99 float64)) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title + ", p50 and p99"
	p.X.Label.Text = "rows in idempotency_keys (log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = rowTicks(res.Stages)
	var p50, p99 plotter.XYs
	top := 0.0
	for _, s := range res.Stages {
		x := float64(s.TableRows + 1) // +1: the log scale has no 0
		a, b := pick(s)
		p50 = append(p50, plotter.XY{X: x, Y: a})
		p99 = append(p99, plotter.XY{X: x, Y: b})
		top = max(top, a, b)
	}
	if err := plotutil.AddLinePoints(p, "p99", p99, "p50", p50); err != nil {
		return nil, err
	}
	for _, line := range []plotter.XYs{p99, p50} {
		labels := make([]string, len(line))
		for i, xy := range line {
			labels[i] = formatMs(xy.Y)
		}
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: line, Labels: labels})
		if err != nil {
			return nil, err
		}
		l.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(4)}
		p.Add(l)
	}
	// Headroom above the lines for the legend and the labels.
	p.Y.Min, p.Y.Max = 0, top*1.45
	p.Y.Tick.Marker = msTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(6)
	return p, nil
}

// formatMs renders a point's milliseconds to two significant digits or
// whole milliseconds.
func formatMs(v float64) string {
	switch {
	case v < 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
}

// msTicks are plot.DefaultTicks with one precision on the whole axis: whole
// numbers when every labelled tick is one, else one decimal.
type msTicks struct{}

// Ticks returns the default ticks with consistent labels.
func (msTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	prec := 0
	for _, t := range ticks {
		if t.Label != "" && t.Value != math.Trunc(t.Value) {
			prec = 1
		}
	}
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', prec, 64)
		}
	}
	return ticks
}

// rowTicks puts one tick at each measured size, labelled 0, 100k, 1M, 10M.
func rowTicks(stages []Stage) plot.ConstantTicks {
	var ticks plot.ConstantTicks
	for _, s := range stages {
		ticks = append(ticks, plot.Tick{Value: float64(s.TableRows + 1), Label: formatRows(s.TableRows)})
	}
	return ticks
}

// formatRows renders a row count to two significant digits: 2.5k, 1M, 10M.
func formatRows(n int64) string {
	v := float64(n)
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.div {
			return strconv.FormatFloat(roundSig(v/u.div), 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// roundSig rounds to two significant digits.
func roundSig(v float64) float64 {
	if v >= 10 {
		return math.Round(v)
	}
	return math.Round(v*10) / 10
}

// describe is the run's settings for the report, leaving out those not set
// (a rate of 0, a p99 of 0s), which would read as measured zeros.
func (c config) describe() map[string]string {
	sizes := make([]string, len(c.sizes))
	for i, s := range c.sizes {
		sizes[i] = strconv.FormatInt(s, 10)
	}
	m := map[string]string{
		"sizes": strings.Join(sizes, ","), "duration": c.duration.String(), "warmup": c.warmup.String(),
		"concurrency": strconv.Itoa(c.concurrency), "principals": strconv.Itoa(c.principals),
		"replay_fraction":   strconv.FormatFloat(c.replayFraction, 'f', -1, 64),
		"processor_latency": c.processorLatency.String(), "drain": c.drain.String(), "outbox_workers": strconv.Itoa(c.outboxWorkers),
		"key_shape": c.keyShape, "webhook_latency": c.webhookLatency.String(),
	}
	if c.rate > 0 {
		m["rate"] = strconv.FormatFloat(c.rate, 'f', -1, 64)
	}
	if c.processorLatencyP99 > 0 {
		m["processor_latency_p99"] = c.processorLatencyP99.String()
	}
	if c.curve {
		delete(m, "replay_fraction")
		delete(m, "key_shape")
		m["key_shapes"], m["windows"] = strings.Join(c.keyShapes, ","), strconv.Itoa(c.windows)
		m["sweep_rate"] = strconv.FormatFloat(c.sweepRate, 'f', -1, 64)
		if c.memory > 0 {
			m["memory"] = humanBytes(c.memory)
		}
	} else {
		m["repeats"], m["compare_duration"] = strconv.Itoa(c.repeats), c.compareDuration.String()
	}
	return m
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

// fellBehind says whether the outbox did not keep up with the stage: more
// than two seconds of its payments were waiting when the run ended, or some
// were still not charged when the drain gave up.
func (s Stage) fellBehind() bool {
	return s.ChargesLeft > 0 || float64(s.OutboxBacklog) > 2*s.RPS
}
