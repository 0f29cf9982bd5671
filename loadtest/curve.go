package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The curve is what the load test exists for: the claim's latency against
// the key table's size, per key shape, with the size where the unique index
// outgrows the memory PostgreSQL has marked on it. Each size is filled with
// one INSERT ... SELECT generate_series on the server (a million rows in
// about 9 s here, indexes in place, so the index has the shape random
// inserts give it), then measured in windows, whose spread the plot shows.

// Curve is curve.json.
type Curve struct {
	StartedAt        time.Time         `json:"started_at"`
	GoVersion        string            `json:"go_version"`
	PostgresVersion  string            `json:"postgres_version"`
	PostgresSettings map[string]string `json:"postgres_settings"`
	Machine          map[string]string `json:"machine"`
	Settings         map[string]string `json:"settings"`
	// MemoryLimit is the memory cgroup's limit PostgreSQL ran in (0: none);
	// Memory what the index is set against: that limit, or without one the
	// machine's memory.
	MemoryLimit int64 `json:"memory_limit_bytes"`
	Memory      int64 `json:"memory_bytes"`
	// The machine's load average before the run, against its cores: above
	// them, other work shared the machine and nothing here is a finding.
	LoadBefore float64 `json:"load_before"`
	Cores      int     `json:"cores"`
	Busy       bool    `json:"busy"`
	Points     []Point `json:"points"`
	// IndexBytesPerRow is the unique index's size per row at the largest
	// size of random keys; PredictedKneeRows the rows at which it reaches
	// Memory.
	IndexBytesPerRow  float64 `json:"index_bytes_per_row"`
	PredictedKneeRows int64   `json:"predicted_knee_rows"`
	// The steady state the sweeper keeps: SweepRate new keys per second
	// live for the 24 h window, so the table holds SteadyRows and the index
	// SteadyIndexBytes.
	SweepRate        float64   `json:"sweep_rate"`
	SteadyRows       int64     `json:"steady_rows"`
	SteadyIndexBytes int64     `json:"steady_index_bytes"`
	Findings         []Finding `json:"findings"`
	Notes            []string  `json:"notes,omitempty"`
}

// Point is one table size measured with one key shape.
type Point struct {
	KeyShape string `json:"key_shape"`
	// The rows when the measured windows began (the warm-up adds some to
	// the size asked for) and when they ended.
	TableRows    int64   `json:"table_rows"`
	TableRowsEnd int64   `json:"table_rows_end"`
	TableBytes   int64   `json:"table_bytes"`
	IndexBytes   int64   `json:"index_bytes"` // the unique index, (principal_id, endpoint, key)
	FillSeconds  float64 `json:"fill_seconds"`
	Requests     int     `json:"requests"`
	RPS          float64 `json:"rps"`
	// Over every sample of the size; the p99's spread is over its windows.
	ClaimP50    float64  `json:"claim_p50_ms"`
	ClaimP99    float64  `json:"claim_p99_ms"`
	ClaimP99Min float64  `json:"claim_p99_min_ms"`
	ClaimP99Max float64  `json:"claim_p99_max_ms"`
	RequestP99  float64  `json:"request_p99_ms"`
	Windows     []Window `json:"windows"`
	// WAL the database wrote per new payment, and the unique index's blocks
	// PostgreSQL had to read in (not found in shared_buffers) per claim:
	// the index leaving memory shows here first.
	WALBytesPerPayment float64 `json:"wal_bytes_per_payment"`
	IndexReadsPerClaim float64 `json:"index_reads_per_claim"`
	// ReadMicros is what one block read from outside shared_buffers took on
	// average, over the whole database (track_io_timing; 0 when it is off):
	// what a miss costs on this machine's storage.
	ReadMicros float64        `json:"read_us_per_block,omitempty"`
	Errors     map[string]int `json:"errors,omitempty"`
	// The charge jobs not finished when the windows ended; OutboxBehind
	// when that is more than two seconds of the size's payments, so the
	// outbox's work shared the machine with the next size's.
	OutboxBacklog int64 `json:"outbox_backlog"`
	OutboxBehind  bool  `json:"outbox_behind"`
}

// Window is one measured window of a size.
type Window struct {
	Requests   int     `json:"requests"`
	ClaimP50   float64 `json:"claim_p50_ms"`
	ClaimP99   float64 `json:"claim_p99_ms"`
	RequestP99 float64 `json:"request_p99_ms"`
}

// Finding is a ratio the issue that asked for the curve set a target for.
type Finding struct {
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Target  string  `json:"target"`
	Verdict string  `json:"verdict"` // met, missed, or why it is not judged
}

// runCurve measures the curve and writes curve.json, curve.md and curve.png.
func runCurve(ctx context.Context, cfg config, progress io.Writer) error {
	if cfg.apiURL != "" {
		return fmt.Errorf("-curve starts its own API: it reads the claim's Server-Timing and empties the tables between key shapes")
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	cv := &Curve{StartedAt: time.Now().UTC(), GoVersion: runtime.Version(), Settings: cfg.describe(), Cores: runtime.NumCPU(),
		MemoryLimit: cfg.memory, SweepRate: cfg.sweepRate, Machine: machineInfo()}
	if load, err := loadAverage(); err == nil {
		cv.LoadBefore, cv.Busy = load, load > float64(cv.Cores)
		if cv.Busy {
			fmt.Fprintf(progress, "warning: the machine is busy (load average %.1f on %d cores): the curve will not be a finding\n", load, cv.Cores)
		}
	}
	if cfg.memory > 0 {
		url, stop, err := startLimited(ctx, cfg.memory, progress)
		if err != nil {
			return err
		}
		defer stop()
		cfg.databaseURL, cfg.appDatabaseURL, cfg.maintenanceURL, cfg.takeOver = url, "", "", true
	}
	if err := requireLoopback(cfg.databaseURL); err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	fmt.Fprintln(progress, "preparing the database")
	if err := claimDatabase(ctx, cfg); err != nil {
		return err
	}
	adminCfg, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return err
	}
	adminCfg.MaxConns = adminConns
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	var res Results
	if err := describeDatabase(ctx, admin, &res); err != nil {
		return err
	}
	cv.PostgresVersion, cv.PostgresSettings = res.PostgresVersion, res.PostgresSettings
	cv.Memory = cfg.memory
	if cv.Memory == 0 {
		cv.Memory = machineMemory()
	}
	if _, err := admin.Exec(ctx, `TRUNCATE idempotency_keys, refunds, payments, idempotency_key_usage, river_job, outbox_jobs`); err != nil {
		return fmt.Errorf("empty the tables: %w", err)
	}
	clients, err := createClients(ctx, admin, cfg.principals)
	if err != nil {
		return err
	}
	if cfg.metricsAddr == "off" {
		if cfg.metricsAddr, err = freeLoopbackAddr(); err != nil {
			return err
		}
	}
	stopAPI, apiURL, err := startAPI(ctx, cfg, progress)
	if err != nil {
		return err
	}
	defer stopAPI()

	for _, shape := range cfg.keyShapes {
		if _, err := admin.Exec(ctx, `TRUNCATE idempotency_keys, payments, refunds, river_job, outbox_jobs`); err != nil {
			return fmt.Errorf("empty the tables: %w", err)
		}
		shapeCfg := cfg
		shapeCfg.keyShape = shape
		driver := newDriver(apiURL, shapeCfg, clients)
		for i, size := range cfg.sizes {
			label := fmt.Sprintf("%s keys, size %d/%d, %s rows", shape, i+1, len(cfg.sizes), humanCount(size))
			p, err := measurePoint(ctx, cfg, admin, driver, clients, shape, size, label, progress)
			if err != nil {
				return err
			}
			cv.Points = append(cv.Points, p)
			fmt.Fprintf(progress, "\r%s: claim p50 %.2f ms, p99 %.2f ms (windows %.2f-%.2f), request p99 %.1f ms, index %s, %.2f index reads per claim%20s\n",
				label, p.ClaimP50, p.ClaimP99, p.ClaimP99Min, p.ClaimP99Max, p.RequestP99, humanBytes(p.IndexBytes), p.IndexReadsPerClaim, "")
		}
	}
	cv.summarize()
	return writeCurve(cfg.out, cv)
}

// measurePoint fills the table to size with keys of shape, warms up and
// measures cfg.windows windows of new payments.
func measurePoint(ctx context.Context, cfg config, admin *pgxpool.Pool, driver *driver, clients []client, shape string, size int64, label string, progress io.Writer) (Point, error) {
	p := Point{KeyShape: shape}
	if _, err := outboxDrain(ctx, admin, cfg.drain); err != nil {
		return p, err
	}
	start := time.Now()
	if err := fillKeys(ctx, admin, clients, shape, size, cfg.responseBytes, progress, label); err != nil {
		return p, err
	}
	p.FillSeconds = time.Since(start).Seconds()
	// CHECKPOINT: every size starts alike, each page's next change paying a
	// full-page image in the WAL.
	for _, q := range []string{`VACUUM ANALYZE idempotency_keys`, `ANALYZE payments, river_job`, `CHECKPOINT`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return p, fmt.Errorf("%s: %w", q, err)
		}
	}
	fmt.Fprintf(progress, "\r%s: warming up%30s", label, "")
	driver.run(ctx, paymentsPath, 0, cfg.warmup, nil, label)
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&p.TableRows); err != nil {
		return p, err
	}
	walBefore, err := walPosition(ctx, admin)
	if err != nil {
		return p, err
	}
	readsBefore, err := indexReads(ctx, admin)
	if err != nil {
		return p, err
	}
	io0, err := readTiming(ctx, admin)
	if err != nil {
		return p, err
	}
	window := max(time.Second, cfg.duration/time.Duration(cfg.windows))
	var all measurement
	for w := range cfg.windows {
		m := driver.run(ctx, paymentsPath, 0, window, progress, fmt.Sprintf("%s, window %d/%d", label, w+1, cfg.windows))
		var st Stage
		m.fill(&st, window)
		p.Windows = append(p.Windows, Window{Requests: st.Requests, ClaimP50: st.ClaimP50, ClaimP99: st.ClaimP99, RequestP99: st.RequestP99})
		all.samples = append(all.samples, m.samples...)
	}
	walAfter, err := walPosition(ctx, admin)
	if err != nil {
		return p, err
	}
	readsAfter, err := indexReads(ctx, admin)
	if err != nil {
		return p, err
	}
	io1, err := readTiming(ctx, admin)
	if err != nil {
		return p, err
	}
	if blocks := io1.blocks - io0.blocks; blocks >= 100 { // fewer are no average
		p.ReadMicros = 1000 * (io1.millis - io0.millis) / float64(blocks)
	}
	var st Stage
	all.fill(&st, window*time.Duration(cfg.windows))
	p.Requests, p.RPS, p.ClaimP50, p.ClaimP99, p.RequestP99 = st.Requests, st.RPS, st.ClaimP50, st.ClaimP99, st.RequestP99
	if len(st.Errors) > 0 {
		p.Errors = st.Errors
	}
	p.ClaimP99Min, p.ClaimP99Max = math.Inf(1), 0
	for _, w := range p.Windows {
		p.ClaimP99Min, p.ClaimP99Max = min(p.ClaimP99Min, w.ClaimP99), max(p.ClaimP99Max, w.ClaimP99)
	}
	if p.Requests > 0 {
		p.WALBytesPerPayment = float64(walAfter-walBefore) / float64(p.Requests)
		p.IndexReadsPerClaim = float64(readsAfter-readsBefore) / float64(p.Requests)
	}
	stats, err := tableStats(ctx, admin)
	if err != nil {
		return p, err
	}
	p.TableRowsEnd, p.TableBytes, p.IndexBytes = stats.TableRows, stats.TableBytes, stats.IndexBytes
	if p.OutboxBacklog, err = outboxBacklog(ctx, admin); err != nil {
		return p, err
	}
	p.OutboxBehind = float64(p.OutboxBacklog) > 2*p.RPS
	return p, nil
}

// indexReads is how many blocks of the unique index PostgreSQL has read
// into shared_buffers (from the page cache or the disk) since it started.
func indexReads(ctx context.Context, admin *pgxpool.Pool) (int64, error) {
	var n int64
	err := admin.QueryRow(ctx, `SELECT coalesce(idx_blks_read, 0) FROM pg_statio_user_indexes WHERE indexrelname = 'idempotency_keys_pkey'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("index reads: %w", err)
	}
	return n, nil
}

// ioCounters are the database's block reads and the milliseconds they took.
type ioCounters struct {
	blocks int64
	millis float64
}

// readTiming reads them; the milliseconds stay 0 unless track_io_timing is
// on (scripts/limited-postgres turns it on).
func readTiming(ctx context.Context, admin *pgxpool.Pool) (ioCounters, error) {
	var c ioCounters
	err := admin.QueryRow(ctx, `SELECT blks_read, blk_read_time FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.blocks, &c.millis)
	if err != nil {
		return c, fmt.Errorf("read timing: %w", err)
	}
	return c, nil
}

// fillSQL adds the rows $3..$4 of the bulk load, spread over the principals
// $1 ($2 of them), created at any moment of the last 24 hours (live rows,
// as in a steady state), with keys of shape $5: random UUIDs, or UUIDv7
// text whose first 48 bits are the row's creation in milliseconds, as a
// client sending time-ordered keys would have made them. The rows go in in
// the unique index's order: PostgreSQL then walks the index once from left
// to right instead of reading a random leaf per row, which, once the index
// no longer fits in memory, made a million rows take minutes of random
// reads. The leaves split as they fill, as they do under random inserts.
const fillSQL = `
INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, response_status,
                              response_content_type, response_body, correlation_id, created_at, expires_at)
SELECT principal_id, 'POST /v1/payments', key, 'completed', sha256(convert_to(h, 'UTF8')), 201, 'application/json', $6,
       'bulk_' || g, created, created + interval '25 hours'
FROM (SELECT g, created, h, ($1::uuid[])[1 + g % $2] AS principal_id,
             CASE WHEN $5 = 'v7' THEN substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(h, 1, 3) || '-8' || substr(h, 4, 3) || '-' || substr(h, 7, 12)
             ELSE gen_random_uuid()::text END AS key
      FROM (SELECT g, created, md5(random()::text) AS h, lpad(to_hex((extract(epoch FROM created) * 1000)::bigint), 12, '0') AS t
            FROM (SELECT g, now() - random() * interval '24 hours' AS created
                  FROM generate_series($3::bigint, $4::bigint) AS g) AS times) AS hashed) AS rows
ORDER BY principal_id, key`

// fillKeys adds rows of shape until the table holds size, in chunks, so a
// large size reports its progress and no transaction grows without bound.
func fillKeys(ctx context.Context, admin *pgxpool.Pool, clients []client, shape string, size int64, responseBytes int, progress io.Writer, label string) error {
	var have int64
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&have); err != nil {
		return err
	}
	principals := make([]uuid.UUID, len(clients))
	for i, c := range clients {
		principals[i] = uuid.MustParse(c.principal)
	}
	response := newLoader(admin, clients, responseBytes).response
	const chunk = 500_000
	for from := have + 1; from <= size; from += chunk {
		to := min(size, from+chunk-1)
		fmt.Fprintf(progress, "\r%s: loading %s/%s rows   ", label, humanCount(to), humanCount(size))
		if _, err := admin.Exec(ctx, fillSQL, principals, len(principals), from, to, shape, response); err != nil {
			return fmt.Errorf("fill to %d rows: %w", to, err)
		}
	}
	return nil
}

// machineMemory is the machine's memory in bytes (Linux), 0 when unknown.
func machineMemory() int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// retentionWindow is the service's default retry window, which the steady
// state of the key table is the payment rate times.
const retentionWindow = 24 * time.Hour

// summarize computes the predicted knee, the sweeper's steady state and the
// findings from the points.
func (cv *Curve) summarize() {
	random, ordered := cv.shape(keyShapeRandom), cv.shape(keyShapeTimeOrdered)
	if n := len(random); n > 0 && random[n-1].TableRowsEnd > 0 {
		cv.IndexBytesPerRow = float64(random[n-1].IndexBytes) / float64(random[n-1].TableRowsEnd)
	}
	if cv.IndexBytesPerRow > 0 && cv.Memory > 0 {
		cv.PredictedKneeRows = int64(float64(cv.Memory) / cv.IndexBytesPerRow)
	}
	cv.SteadyRows = int64(cv.SweepRate * retentionWindow.Seconds())
	cv.SteadyIndexBytes = int64(float64(cv.SteadyRows) * cv.IndexBytesPerRow)

	judge := func(name string, value, target float64, atLeast bool) {
		f := Finding{Name: name, Value: value}
		if atLeast {
			f.Target = fmt.Sprintf(">= %.2f", target)
		} else {
			f.Target = fmt.Sprintf("<= %.2f", target)
		}
		switch {
		case cv.Busy:
			f.Verdict = "not judged: the machine was busy"
		case (atLeast && value >= target) || (!atLeast && value <= target):
			f.Verdict = "met"
		default:
			f.Verdict = "missed"
		}
		cv.Findings = append(cv.Findings, f)
	}
	// measured is a ratio with no target: reported, never met or missed.
	measured := func(name string, value float64) {
		f := Finding{Name: name, Value: value, Target: "none", Verdict: "measured"}
		if cv.Busy {
			f.Verdict = "not a finding: the machine was busy"
		}
		cv.Findings = append(cv.Findings, f)
	}
	if len(random) > 1 && cv.MemoryLimit > 0 {
		var fits []Point
		for _, p := range random {
			if p.IndexBytes <= cv.Memory && p.TableRows > 0 {
				fits = append(fits, p)
			}
		}
		last := random[len(random)-1]
		if len(fits) > 0 && last.IndexBytes > cv.Memory {
			ref := medianOf(fits, func(p Point) float64 { return p.ClaimP99 })
			judge("random keys: claim p99 at the largest size / where the index fits (median of those sizes)", last.ClaimP99/ref, 2, true)
			knee := false
			for _, p := range random {
				if p.ClaimP99 >= 2*ref && cv.PredictedKneeRows > 0 {
					judge(fmt.Sprintf("the knee's size (first size at 2x: %s rows) / the size predicted from index bytes per row (%s rows)", formatRows(p.TableRows), formatRows(cv.PredictedKneeRows)),
						float64(p.TableRows)/float64(cv.PredictedKneeRows), 2, false)
					knee = true
					break
				}
			}
			if !knee {
				cv.Notes = append(cv.Notes, "no size's claim p99 reached twice the p99 where the index fits: no knee of that height to place against the prediction")
			}
			measured("random keys: claim p50 at the largest size / where the index fits", last.ClaimP50/medianOf(fits, func(p Point) float64 { return p.ClaimP50 }))
			if r := medianOf(fits, func(p Point) float64 { return p.IndexReadsPerClaim }); r > 0 {
				measured("random keys: index blocks read in per claim at the largest size / where the index fits", last.IndexReadsPerClaim/r)
			}
		} else {
			cv.Notes = append(cv.Notes, "the largest size's index still fitted the memory limit, or no smaller size did: no knee to judge; choose larger -sizes or a smaller -memory")
		}
	}
	if len(random) > 1 && cv.MemoryLimit == 0 && random[0].ClaimP99 > 0 {
		judge("random keys, no memory limit: claim p99 at the largest size / at the first", random[len(random)-1].ClaimP99/random[0].ClaimP99, 1.25, false)
	}
	if len(ordered) > 1 && ordered[0].ClaimP99 > 0 {
		judge("time-ordered keys: claim p99 at the largest size / at the first", ordered[len(ordered)-1].ClaimP99/ordered[0].ClaimP99, 1.25, false)
	}
	if len(random) > 0 && len(ordered) > 0 {
		r, o := random[len(random)-1], ordered[len(ordered)-1]
		if o.ClaimP99 > 0 && o.WALBytesPerPayment > 0 {
			measured("at the largest size: claim p99, random keys / time-ordered keys", r.ClaimP99/o.ClaimP99)
			measured("at the largest size: WAL per payment, random keys / time-ordered keys", r.WALBytesPerPayment/o.WALBytesPerPayment)
		}
	}
}

// medianOf is the median of f over ps.
func medianOf(ps []Point, f func(Point) float64) float64 {
	xs := make([]float64, len(ps))
	for i, p := range ps {
		xs[i] = f(p)
	}
	m, _, _ := spread(xs)
	return m
}

// shape is the points of one key shape, in size order.
func (cv *Curve) shape(s string) []Point {
	var out []Point
	for _, p := range cv.Points {
		if p.KeyShape == s {
			out = append(out, p)
		}
	}
	return out
}

// writeCurve writes curve.json, curve.md and curve.png to dir.
func writeCurve(dir string, cv *Curve) error {
	if err := writeJSON(filepath.Join(dir, "curve.json"), cv); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "curve.md"), []byte(curveReport(cv)), 0o644); err != nil {
		return err
	}
	return plotCurve(filepath.Join(dir, "curve.png"), cv)
}
