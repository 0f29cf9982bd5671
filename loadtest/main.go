// Command loadtest measures what idempotency costs: the claim's p99 latency as
// the key table grows, the service's throughput against the same write
// without idempotency, and against what PostgreSQL alone sustains for the
// same SQL (pgbench).
//
//	go run ./loadtest                                    # small default, about 4 minutes on 2 cores
//	go run ./loadtest -sizes 0,1000000,10000000 -duration 30s -concurrency 16
//	go run ./loadtest -curve -memory 384MB                # the curve and its knee, about 9 minutes
//
// It builds and starts the API (cmd/api) on a loopback port, or targets one
// given with -api-url, bulk-loads the key table with COPY before each stage,
// and writes results.json, report.md, latency.png and outbox.png to -out
// (default loadtest-results). -curve measures the claim's curve against the
// table's size instead (curve.go), and -memory runs it on a PostgreSQL of its
// own inside a memory limit.
// -replot DIR rewrites DIR's report and plots from its results.json (or its
// curve.json). It only ever
// sends traffic to loopback addresses, and every loop is bounded in time.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(2)
	}
	if cfg.replot != "" {
		if err := replot(cfg.replot); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.curve {
		if err := runCurve(ctx, cfg, progressTo(os.Stderr)); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
			os.Exit(1)
		}
		return
	}
	res, err := run(ctx, cfg, progressTo(os.Stderr))
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "\nwrote %s/results.json, report.md, latency.png, outbox.png (overhead ratio %.2f)\n", cfg.out, res.OverheadRatio)
}

// config is every knob of a run.
type config struct {
	sizes          []int64
	duration       time.Duration
	warmup         time.Duration
	concurrency    int
	rate           float64 // requests per second across all workers; 0 = closed loop
	replayFraction float64
	principals     int
	out            string
	databaseURL    string // a superuser (bulk load bypasses row-level security)
	appDatabaseURL string // the service role; derived from databaseURL when empty
	maintenanceURL string // derived from databaseURL when empty
	apiURL         string // target this API instead of starting one
	baseline       bool
	redisPeer      string // Redis for the peer design; "" skips it
	takeOver       bool   // own and empty a database the load test did not create
	pgbench        bool
	responseBytes  int    // size of the bulk-loaded rows' stored responses
	metricsAddr    string // the started API's metrics and pprof listener
	dbMaxConns     int    // the started API's DB_MAX_CONNS
	replot         string // redraw this directory's report from its results.json
	profile        bool   // capture the started API's CPU profile in the first stage
	// The started API's processor: median and p99 latency (p99 0: fixed).
	processorLatency, processorLatencyP99 time.Duration
	// webhookLatency is the receiver's answer time; 0: no endpoints.
	webhookLatency  time.Duration
	drain           time.Duration // longest wait for the outbox to empty after a run
	outboxWorkers   int           // the started API's OUTBOX_WORKERS
	outboxConns     int           // the started API's OUTBOX_DB_MAX_CONNS
	walCompression  []string      // per stage, cycling: the server's wal_compression ("" leaves it)
	repeats         int           // interleaved rounds of the design comparisons
	compareDuration time.Duration // each design's run in a round
	keyShape        string        // the driver's new keys: keyShapeRandom or keyShapeTimeOrdered
	// The curve (curve.go): the key shapes measured one after the other,
	// the measured windows per size, PostgreSQL's memory limit (0: the
	// server at -database-url as it is), and the payment rate whose steady
	// state the report places against that memory.
	curve     bool
	keyShapes []string
	windows   int
	memory    int64
	sweepRate float64
}

// The shapes of Idempotency-Key a client can send.
const (
	keyShapeRandom      = "v4" // UUIDv4: anywhere in the index
	keyShapeTimeOrdered = "v7" // UUIDv7: a millisecond timestamp first
)

// curveSizes are the curve's default table sizes: a logarithmic scale that,
// within -memory 384MB, passes the size where the unique index no longer
// fits (about 2.5M rows, docs/performance.md).
const curveSizes = "0,100000,300000,1000000,3000000,6000000"

// curveRate is the curve's default open-loop rate, requests per second.
const curveRate = 100

// adminConns is the load test's own pool: one connection loads, one reads
// the table's statistics.
const adminConns = 2

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	var c config
	sizes := fs.String("sizes", "0,200000", "key-table sizes (rows) to measure at, comma-separated, ascending")
	fs.DurationVar(&c.duration, "duration", 15*time.Second, "measured run per stage")
	fs.DurationVar(&c.warmup, "warmup", 3*time.Second, "unmeasured warm-up before each stage")
	fs.IntVar(&c.concurrency, "concurrency", 16, "concurrent clients")
	fs.Float64Var(&c.rate, "rate", 0, "target requests per second in all (0 = closed loop: each client sends as fast as it gets answers)")
	fs.Float64Var(&c.replayFraction, "replay-fraction", 0.05, "share of requests that retry an earlier key of the run")
	fs.IntVar(&c.principals, "principals", 64, "principals (tenants) the load and the bulk rows are spread over")
	fs.StringVar(&c.out, "out", "loadtest-results", "output directory")
	fs.StringVar(&c.replot, "replot", "", "rewrite `DIR`'s report.md and plots from its results.json, and run nothing")
	fs.StringVar(&c.databaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/payments_loadtest?sslmode=disable",
		"superuser URL of the database to use (created and migrated if missing)")
	fs.StringVar(&c.appDatabaseURL, "app-database-url", "", "service-role URL for the API it starts (default: -database-url as payments_app)")
	fs.StringVar(&c.maintenanceURL, "maintenance-database-url", "", "maintenance-role URL for the API it starts (default: -database-url as payments_maintenance)")
	fs.StringVar(&c.apiURL, "api-url", "", "target an API already running (loopback only): the load test's server, go run ./loadtest/server, for the baseline, the peer and the claim timing")
	fs.BoolVar(&c.baseline, "baseline", true, "also measure the same write without idempotency")
	fs.BoolVar(&c.takeOver, "take-over", false, "let the load test own and empty a database it did not create")
	fs.StringVar(&c.redisPeer, "redis-peer", "127.0.0.1:6379", "also measure the peer design, keys claimed in this Redis (loopback only; \"\" skips it)")
	fs.BoolVar(&c.pgbench, "pgbench", true, "also run pgbench with the service's SQL, if pgbench is installed")
	fs.IntVar(&c.responseBytes, "response-bytes", 250, "stored response size of bulk-loaded rows")
	fs.IntVar(&c.dbMaxConns, "db-max-conns", 0, "DB_MAX_CONNS of the API it starts (default: the larger of 32 and twice -concurrency)")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "off", "metrics and pprof listener of the API it starts, e.g. 127.0.0.1:6060 (with -profile, a free loopback port when off)")
	fs.BoolVar(&c.profile, "profile", true, "capture the API's CPU profile during the first stage (cpu.pprof; where the CPU goes in report.md)")
	latency := fs.String("processor-latency", "300ms", "the started API's processor latency: `MEDIAN[,P99]` (log-normal with that tail), e.g. 300ms or 300ms,800ms; 0 answers at once")
	fs.DurationVar(&c.webhookLatency, "webhook-latency", 300*time.Millisecond, "one webhook endpoint per principal, at a loopback receiver that answers after this (the payments' events are delivered during the run); 0: no endpoints")
	fs.IntVar(&c.outboxWorkers, "outbox-workers", 400, "OUTBOX_WORKERS of the API it starts (the service's default)")
	fs.IntVar(&c.outboxConns, "outbox-db-max-conns", 16, "OUTBOX_DB_MAX_CONNS of the API it starts (the service's default)")
	walCompression := fs.String("wal-compression", "", "set the server's wal_compression per stage, cycling through the list (e.g. off,lz4 with -sizes 10000000,10000000,10000000,10000000), with ALTER SYSTEM and a reload, reset at the end; empty leaves the server alone")
	fs.IntVar(&c.repeats, "repeats", 3, "interleaved rounds of ours, baseline, peer and pgbench at the first stage's size, for the ratios' median and range")
	fs.DurationVar(&c.compareDuration, "compare-duration", 0, "each design's run in a round (default: -duration / 3, at least 3s)")
	fs.DurationVar(&c.drain, "drain", time.Minute, "longest wait for the outbox to finish a run's charges; what is left is reported")
	fs.BoolVar(&c.curve, "curve", false, "measure the curve instead: claim p50/p99 against the table's size, per key shape, in -windows windows per size (curve.md, curve.png); -sizes defaults to "+curveSizes)
	fs.StringVar(&c.keyShape, "key-shape", keyShapeRandom, "the Idempotency-Keys clients send: v4 (random) or v7 (time-ordered)")
	keyShapes := fs.String("key-shapes", keyShapeRandom+","+keyShapeTimeOrdered, "with -curve: the key shapes to measure, one table each")
	fs.IntVar(&c.windows, "windows", 4, "with -curve: measured windows per size (of -duration / windows each), for the p99's spread")
	memory := fs.String("memory", "", "with -curve: start a PostgreSQL of the load test's own inside this memory limit, page cache included (e.g. 384MB; Linux, as root or with systemd; scripts/limited-postgres), instead of using -database-url")
	fs.Float64Var(&c.sweepRate, "sweep-rate", 100, "with -curve: the new payments per second whose steady-state key table (rate x 24 h window) the report places against the memory")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.curve && !set["sizes"] {
		*sizes = curveSizes
	}
	if c.curve && !set["rate"] {
		// Below what the machine sustains, so that the claim's p99 is its
		// own cost, not the wait for a core.
		c.rate = curveRate
	}
	if c.curve && !set["duration"] {
		c.duration = 20 * time.Second
	}
	if *memory != "" {
		if !c.curve {
			return config{}, fmt.Errorf("-memory is a setting of -curve")
		}
		n, err := parseBytes(*memory)
		if err != nil {
			return config{}, fmt.Errorf("-memory: %w", err)
		}
		c.memory = n
	}
	for _, v := range append([]string{c.keyShape}, strings.Split(*keyShapes, ",")...) {
		if v = strings.TrimSpace(v); v != keyShapeRandom && v != keyShapeTimeOrdered {
			return config{}, fmt.Errorf("key shape %q is not v4 or v7", v)
		}
	}
	for _, v := range strings.Split(*keyShapes, ",") {
		c.keyShapes = append(c.keyShapes, strings.TrimSpace(v))
	}
	if c.windows < 1 || c.sweepRate <= 0 {
		return config{}, fmt.Errorf("-windows must be at least 1 and -sweep-rate above 0")
	}
	if *walCompression != "" {
		for _, v := range strings.Split(*walCompression, ",") {
			switch v = strings.TrimSpace(v); v {
			case "off", "on", "pglz", "lz4", "zstd":
				c.walCompression = append(c.walCompression, v)
			default:
				return config{}, fmt.Errorf("-wal-compression: %q is not off, on, pglz, lz4 or zstd", v)
			}
		}
	}
	var err error
	if c.processorLatency, c.processorLatencyP99, err = parseLatency(*latency); err != nil {
		return config{}, fmt.Errorf("-processor-latency: %w", err)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n < 0 {
			return config{}, fmt.Errorf("-sizes: %q is not a row count", s)
		}
		if len(c.sizes) > 0 && n < c.sizes[len(c.sizes)-1] {
			return config{}, fmt.Errorf("-sizes must ascend: rows are only ever added")
		}
		c.sizes = append(c.sizes, n)
	}
	if c.concurrency < 1 || c.principals < 1 || c.duration <= 0 || c.replayFraction < 0 || c.replayFraction >= 1 {
		return config{}, fmt.Errorf("invalid -concurrency, -principals, -duration or -replay-fraction")
	}
	if c.compareDuration == 0 {
		c.compareDuration = max(3*time.Second, c.duration/3)
	}
	if c.repeats < 1 {
		return config{}, fmt.Errorf("-repeats must be at least 1")
	}
	if c.dbMaxConns == 0 {
		c.dbMaxConns = max(32, 2*c.concurrency)
	}
	return c, nil
}

// progressTo returns where progress goes: f itself on a terminal, where a
// line that begins with \r redraws the one before it; elsewhere (a file, a
// pipe, CI's log) plain lines, one per update, so that a redirected log is
// not one line of carriage returns.
func progressTo(f *os.File) io.Writer {
	if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return f
	}
	return plainLines{f}
}

// plainLines turns each write, a whole progress message, into plain lines.
type plainLines struct{ w io.Writer }

func (p plainLines) Write(b []byte) (int, error) {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimRight(bytes.TrimLeft(line, "\r"), " ")
		if i := bytes.LastIndexByte(line, '\r'); i >= 0 {
			line = line[i+1:]
		}
		if len(line) > 0 {
			out = append(append(out, line...), '\n')
		}
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// parseLatency reads MEDIAN[,P99].
func parseLatency(v string) (median, p99 time.Duration, err error) {
	first, second, tail := strings.Cut(v, ",")
	if median, err = time.ParseDuration(strings.TrimSpace(first)); err != nil || median < 0 {
		return 0, 0, fmt.Errorf("%q: want MEDIAN[,P99], e.g. 300ms,800ms", v)
	}
	if tail {
		if p99, err = time.ParseDuration(strings.TrimSpace(second)); err != nil || p99 < median {
			return 0, 0, fmt.Errorf("%q: the p99 must be a duration no shorter than the median", v)
		}
	}
	return median, p99, nil
}
