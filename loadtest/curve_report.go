package main

import (
	"fmt"
	"image/color"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// busyBanner heads every figure and table of a run that shared the machine.
func busyBanner(load float64, cores int) string {
	return fmt.Sprintf("BUSY MACHINE (load %.1f on %d cores): not a finding", load, cores)
}

// bannerTitle puts the busy banner, in red, above a panel's title.
func bannerTitle(p *plot.Plot, load float64, cores int) {
	p.Title.Text = busyBanner(load, cores) + "\n" + p.Title.Text
	p.Title.TextStyle.Color = color.RGBA{R: 200, A: 255}
}

// curveReport is curve.md.
func curveReport(cv *Curve) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The claim against the key table's size\n\nStarted %s. %s, %s. Machine: %s cores, %s memory, %s.\n\n",
		cv.StartedAt.Format(time.RFC3339), cv.GoVersion, cv.PostgresVersion, cv.Machine["cpus"], cv.Machine["memory"], cv.Machine["cpu_model"])
	if cv.MemoryLimit > 0 {
		fmt.Fprintf(&b, "PostgreSQL ran in a memory cgroup of %s, page cache included (scripts/limited-postgres), with shared_buffers = %s: the unique index is set against that limit.\n\n",
			humanBytes(cv.MemoryLimit), pgSize(cv.PostgresSettings["shared_buffers"]))
	} else {
		fmt.Fprintf(&b, "No memory limit: PostgreSQL had the machine's %s (shared_buffers = %s, the rest as page cache), which the unique index is set against.\n\n",
			humanBytes(cv.Memory), pgSize(cv.PostgresSettings["shared_buffers"]))
	}
	if cv.Busy {
		fmt.Fprintf(&b, "**%s.** Other work shared the machine when the run began; run it again on a quiet machine.\n\n", busyBanner(cv.LoadBefore, cv.Cores))
	} else {
		fmt.Fprintf(&b, "The machine was quiet when the run began (load average %.1f on %d cores); the load generator, the API and PostgreSQL share it.\n\n", cv.LoadBefore, cv.Cores)
	}
	b.WriteString("Settings: ")
	for _, k := range sortedKeys(cv.Settings) {
		if v := cv.Settings[k]; v != "" {
			fmt.Fprintf(&b, "`%s=%s` ", k, v)
		}
	}
	b.WriteString("\n\n## Findings\n\n")
	if len(cv.Findings) == 0 {
		b.WriteString("None to judge.\n")
	} else {
		b.WriteString("| ratio | value | target | verdict |\n|---|---:|---|---|\n")
		for _, f := range cv.Findings {
			fmt.Fprintf(&b, "| %s | **%.2f** | %s | %s |\n", f.Name, f.Value, f.Target, f.Verdict)
		}
	}
	if cv.PredictedKneeRows > 0 {
		fmt.Fprintf(&b, "\nThe unique index takes %.0f bytes per row (random keys, at the largest size), so it reaches %s at about **%s rows**: the dotted line in curve.png.\n",
			cv.IndexBytesPerRow, humanBytes(cv.Memory), formatRows(cv.PredictedKneeRows))
	}
	b.WriteString("\n## Per size\n\nEach size: filled, `VACUUM ANALYZE`, `CHECKPOINT`, a warm-up, then the measured windows of new payments. Claim: the `Server-Timing: claim` the server sends (authenticate, claim and look up, one round trip). Index reads: blocks of the unique index PostgreSQL did not find in shared_buffers, per claim; one read: what a block read from outside shared_buffers took on average (`track_io_timing`, on in the load test's own PostgreSQL), which is what a miss costs on this machine's storage.\n\n")
	b.WriteString("| keys | rows measured at | rows at end | unique index | index / memory | bulk-load time | req/s | claim p50 | claim p99 | p99 over windows | request p99 | WAL per payment | index reads per claim | one read | outbox |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|\n")
	for _, p := range cv.Points {
		outbox := "kept up"
		if p.OutboxBehind {
			outbox = fmt.Sprintf("**fell behind** (%d jobs left)", p.OutboxBacklog)
		}
		if len(p.Errors) > 0 {
			outbox += "; errors: " + errorsString(p.Errors)
		}
		read := "not timed"
		if p.ReadMicros > 0 {
			read = fmt.Sprintf("%.0f µs", p.ReadMicros)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %.0f s | %.0f | %.2f ms | **%.2f ms** | %.2f-%.2f ms | %.1f ms | %.0f B | %.2f | %s | %s |\n",
			p.KeyShape, formatRows(p.TableRows), formatRows(p.TableRowsEnd), humanBytes(p.IndexBytes), float64(p.IndexBytes)/float64(max(cv.Memory, 1)),
			p.FillSeconds, p.RPS, p.ClaimP50, p.ClaimP99, p.ClaimP99Min, p.ClaimP99Max, p.RequestP99, p.WALBytesPerPayment, p.IndexReadsPerClaim, read, outbox)
	}
	b.WriteString("\n## What the sweeper buys\n\n")
	if cv.IndexBytesPerRow > 0 {
		verdict := "fits within"
		if cv.SteadyIndexBytes > cv.Memory {
			verdict = "does **not** fit within"
		}
		perDay := cv.SweepRate * 86400
		fmt.Fprintf(&b, "With the sweeper, the table holds what the 24 h window keeps: at %.0f new payments/s (`-sweep-rate`), about %s rows, whose unique index (%.0f B per row) is %s and %s the %s here (the green line in curve.png). Without it the table grows by %s rows a day for ever, and the index would outgrow that memory after %.1f days. The window's steady state fits the memory up to about %.0f new payments/s; above that, the claim runs past the knee however well the sweeper keeps up, and what helps is memory, or keys that keep the index's working set small (time-ordered keys: the v7 rows above).\n",
			cv.SweepRate, formatRows(cv.SteadyRows), cv.IndexBytesPerRow, humanBytes(cv.SteadyIndexBytes), verdict, humanBytes(cv.Memory), formatRows(int64(perDay)),
			float64(cv.PredictedKneeRows)/perDay, float64(cv.PredictedKneeRows)/retentionWindow.Seconds())
	} else {
		b.WriteString("Not computed: no size with random keys and rows was measured.\n")
	}
	for _, n := range cv.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	b.WriteString("\n## PostgreSQL settings\n\n")
	for _, k := range sortedKeys(cv.PostgresSettings) {
		fmt.Fprintf(&b, "- `%s` = %s\n", k, cv.PostgresSettings[k])
	}
	return b.String()
}

// pgSize renders a pg_settings size ("6144 8kB") in bytes' units, or as
// it is when it is not one.
func pgSize(v string) string {
	n, unit, ok := strings.Cut(v, " ")
	blocks, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil {
		return v
	}
	switch unit {
	case "8kB":
		return humanBytes(blocks * 8192)
	case "kB":
		return humanBytes(blocks * 1024)
	}
	return v
}

// whiskers are points with the low and high ends of their spread.
type whiskers struct {
	plotter.XYs
	plotter.YErrors
}

// shapeColor tells the key shapes apart on every panel.
var shapeColor = map[string]color.Color{
	keyShapeRandom:      color.RGBA{R: 200, G: 40, B: 40, A: 255},
	keyShapeTimeOrdered: color.RGBA{R: 30, G: 90, B: 200, A: 255},
}

var shapeName = map[string]string{keyShapeRandom: "random keys (v4)", keyShapeTimeOrdered: "time-ordered keys (v7)"}

// plotCurve draws curve.png: six panels over the table's size (log scale),
// the claim's p99 (whiskers: its range over the windows) and p50, the
// request's p99, the WAL per new payment, the index blocks each claim read
// in, and the unique index's size against the memory; the dotted line is
// where the index reaches the memory.
func plotCurve(path string, cv *Curve) error {
	type panel struct {
		title string
		y     func(Point) float64
	}
	panels := []panel{
		{"claim p99 (whiskers: range over windows), ms", func(p Point) float64 { return p.ClaimP99 }},
		{"claim p50, ms", func(p Point) float64 { return p.ClaimP50 }},
		{"whole request p99 (client), ms", func(p Point) float64 { return p.RequestP99 }},
		{"WAL per new payment, bytes", func(p Point) float64 { return p.WALBytesPerPayment }},
		{"unique-index blocks read in per claim", func(p Point) float64 { return p.IndexReadsPerClaim }},
		{"unique index, MiB (line: the memory)", func(p Point) float64 { return float64(p.IndexBytes) / (1 << 20) }},
	}
	const claimPanel, indexPanel = 0, 5
	var rows [][]*plot.Plot
	var row []*plot.Plot
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		if cv.Busy {
			bannerTitle(p, cv.LoadBefore, cv.Cores)
		}
		p.X.Label.Text = "rows in idempotency_keys (log scale)"
		p.X.Scale = plot.LogScale{}
		var ticks plot.ConstantTicks
		seen := map[int64]bool{}
		top := 0.0
		for _, shape := range []string{keyShapeRandom, keyShapeTimeOrdered} {
			pts := cv.shape(shape)
			if len(pts) == 0 {
				continue
			}
			var xys plotter.XYs
			var errs plotter.YErrors
			for _, pt := range pts {
				x := float64(pt.TableRows + 1) // the log scale has no 0
				xys = append(xys, plotter.XY{X: x, Y: pn.y(pt)})
				errs = append(errs, struct{ Low, High float64 }{pt.ClaimP99 - pt.ClaimP99Min, pt.ClaimP99Max - pt.ClaimP99})
				top = max(top, pn.y(pt))
				if i == claimPanel {
					top = max(top, pt.ClaimP99Max)
				}
				if !seen[pt.TableRows/10_000] {
					seen[pt.TableRows/10_000] = true
					ticks = append(ticks, plot.Tick{Value: x, Label: formatRows(pt.TableRows)})
				}
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = shapeColor[shape], shapeColor[shape]
			p.Add(line, points)
			p.Legend.Add(shapeName[shape], line, points)
			if i == claimPanel {
				bars, err := plotter.NewYErrorBars(whiskers{xys, errs})
				if err != nil {
					return err
				}
				bars.Color = shapeColor[shape]
				p.Add(bars)
			}
		}
		if i == indexPanel && cv.Memory > 0 {
			mem := float64(cv.Memory) / (1 << 20)
			if mem < 4*top || cv.MemoryLimit > 0 {
				l, err := plotter.NewLine(plotter.XYs{{X: float64(minRows(cv) + 1), Y: mem}, {X: float64(maxRows(cv) + 1), Y: mem}})
				if err != nil {
					return err
				}
				l.Color = color.Gray{Y: 90}
				p.Add(l)
				p.Legend.Add("memory", l)
				top = max(top, mem)
			}
		}
		if cv.PredictedKneeRows > 0 && cv.PredictedKneeRows < 3*maxRows(cv) {
			knee, err := plotter.NewLine(plotter.XYs{{X: float64(cv.PredictedKneeRows), Y: 0}, {X: float64(cv.PredictedKneeRows), Y: top * 1.3}})
			if err != nil {
				return err
			}
			knee.Color, knee.Dashes = color.Gray{Y: 60}, []vg.Length{vg.Points(1), vg.Points(3)}
			p.Add(knee)
			if i == claimPanel {
				p.Legend.Add("index = memory", knee)
			}
		}
		// The sweeper's steady state (-sweep-rate x the 24 h window), when
		// it falls near the measured sizes: where a table kept by the
		// sweeper sits on this curve.
		if cv.SteadyRows > 0 && cv.SteadyRows < 3*maxRows(cv) {
			steady, err := plotter.NewLine(plotter.XYs{{X: float64(cv.SteadyRows), Y: 0}, {X: float64(cv.SteadyRows), Y: top * 1.3}})
			if err != nil {
				return err
			}
			steady.Color, steady.Dashes = color.RGBA{G: 130, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}
			p.Add(steady)
			if i == claimPanel {
				p.Legend.Add(fmt.Sprintf("swept steady state at %.0f/s (%s rows)", cv.SweepRate, formatRows(cv.SteadyRows)), steady)
			}
		}
		p.X.Tick.Marker = ticks
		p.Y.Min, p.Y.Max = 0, top*1.35
		p.Legend.Top, p.Legend.Left = true, true
		row = append(row, p)
		if len(row) == 2 {
			rows, row = append(rows, row), nil
		}
	}
	return writePNG(path, rows, 11*vg.Inch, 11*vg.Inch)
}

// maxRows is the largest size measured.
func maxRows(cv *Curve) int64 {
	var n int64
	for _, p := range cv.Points {
		n = max(n, p.TableRowsEnd)
	}
	return n
}

// minRows is the smallest size measured.
func minRows(cv *Curve) int64 {
	n := maxRows(cv)
	for _, p := range cv.Points {
		n = min(n, p.TableRows)
	}
	return n
}
