package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/loadtest/designs"
)

// Stage is what one table size measured.
type Stage struct {
	TableRows     int64          `json:"table_rows"`
	TableRowsEnd  int64          `json:"table_rows_end"`
	TableBytes    int64          `json:"table_bytes"`
	IndexBytes    int64          `json:"index_bytes"` // the unique index on (principal_id, endpoint, key)
	AllIndexBytes int64          `json:"all_index_bytes"`
	LoadSeconds   float64        `json:"load_seconds"`
	Requests      int            `json:"requests"`
	RPS           float64        `json:"rps"`
	RequestP50    float64        `json:"request_p50_ms"`
	RequestP99    float64        `json:"request_p99_ms"`
	RequestP999   float64        `json:"request_p999_ms"`
	ClaimP50      float64        `json:"claim_p50_ms"`
	ClaimP99      float64        `json:"claim_p99_ms"`
	ReplayP99     float64        `json:"replay_p99_ms"`
	Replays       int            `json:"replays"`
	Errors        map[string]int `json:"errors"`
	// The outbox during the measured run (outbox.go): charges completed per
	// second, the payments accepted (charge jobs created) and the share of
	// them charged within the run, the charge lag (payment committed ->
	// outcome committed) over the jobs finished by the end of the drain,
	// the largest backlog, and per second through the run and the drain.
	OutboxCompletedPerSec float64  `json:"outbox_completed_per_sec"`
	ChargesAccepted       int64    `json:"charges_accepted"`
	ChargedToAccepted     float64  `json:"charged_to_accepted"`
	ChargeLagP50          float64  `json:"charge_lag_p50_s"`
	ChargeLagP99          float64  `json:"charge_lag_p99_s"`
	PeakBacklog           int64    `json:"peak_backlog"`
	Timeline              []Second `json:"timeline,omitempty"`
	// OutboxBacklog is the charges and refunds the run left in the outbox,
	// DeliveryBacklog the webhook deliveries; OutboxDrainSeconds
	// how long the drain after it took, at most -drain; ChargesLeft the
	// run's charges not done when the drain ended (then the charge lag
	// leaves them out and is too low).
	OutboxBacklog      int64   `json:"outbox_backlog"`
	DeliveryBacklog    int64   `json:"delivery_backlog,omitempty"`
	OutboxDrainSeconds float64 `json:"outbox_drain_seconds"`
	ChargesLeft        int64   `json:"charges_left"`
	// The webhook deliveries of the run's events (-webhook-latency, one
	// endpoint per principal): how many, how many were not done after the
	// drain, and their lag (event committed -> delivery recorded).
	Deliveries     int64   `json:"deliveries,omitempty"`
	DeliveriesLeft int64   `json:"deliveries_left,omitempty"`
	DeliveryLagP50 float64 `json:"delivery_lag_p50_s,omitempty"`
	DeliveryLagP99 float64 `json:"delivery_lag_p99_s,omitempty"`
	// Updates of idempotency_keys during the measured run (the completions),
	// and how many of them were HOT: no index touched, the new version on
	// the same page.
	Updates    int64   `json:"updates"`
	HotUpdates int64   `json:"hot_updates"`
	HotRatio   float64 `json:"hot_ratio"`
	// A run of nothing but replays of keys this run stored, right after the
	// measured run, and how it compares with it.
	ReplayOnlyRPS  float64 `json:"replay_only_rps"`
	ReplayOnlyP50  float64 `json:"replay_only_p50_ms"`
	ReplayOnlyP99  float64 `json:"replay_only_p99_ms"`
	ReplayToNewRPS float64 `json:"replay_to_new_rps"`
	ReplayToNewP99 float64 `json:"replay_to_new_p99"`
	// WAL the whole database wrote per request, during the measured run and
	// during the replays-alone run: what each costs the log, and so the
	// disk and the replicas.
	WALBytesPerRequest       float64 `json:"wal_bytes_per_request"`
	ReplayWALBytesPerRequest float64 `json:"replay_wal_bytes_per_request"`
	// WALCompression is the server's wal_compression during the stage.
	WALCompression string `json:"wal_compression,omitempty"`
	// What each request cost the API process (when the load test started
	// it): CPU milliseconds and heap allocations, over the measured run
	// (new payments, with the outbox workers charging them in the same
	// process) and over the replays-alone run.
	CPUPerRequestMs        float64 `json:"cpu_per_request_ms,omitempty"`
	AllocsPerRequest       float64 `json:"allocs_per_request,omitempty"`
	ReplayCPUPerRequestMs  float64 `json:"replay_cpu_per_request_ms,omitempty"`
	ReplayAllocsPerRequest float64 `json:"replay_allocs_per_request,omitempty"`
}

// Results is results.json.
type Results struct {
	Stages []Stage `json:"stages"`
	// Comparisons are the ratios of ours to the other designs, measured
	// in interleaved rounds at the first stage's size (compare.go). The
	// single figures below are their medians.
	Comparisons   []Comparison `json:"comparisons"`
	BaselineRPS   float64      `json:"baseline_rps"`
	BaselineP99   float64      `json:"baseline_request_p99_ms"`
	IdempotentRPS float64      `json:"idempotent_rps"`
	OverheadRatio float64      `json:"overhead_ratio"`
	PgbenchTPS    float64      `json:"pgbench_tps"`
	// PgbenchWithoutJobTPS is the same SQL without the outbox job's insert:
	// PgbenchTPS/PgbenchWithoutJobTPS is what the outbox costs the database.
	PgbenchWithoutJobTPS  float64           `json:"pgbench_without_job_tps"`
	ServiceToPgbenchRatio float64           `json:"service_to_pgbench_ratio"`
	Machine               map[string]string `json:"machine"`
	GoVersion             string            `json:"go_version"`
	PostgresVersion       string            `json:"postgres_version"`
	PostgresSettings      map[string]string `json:"postgres_settings"`
	Settings              map[string]string `json:"settings"`
	StartedAt             time.Time         `json:"started_at"`
	Notes                 []string          `json:"notes"`
	// The peer design, the same payment with its key claimed in Redis (SET
	// NX PX) outside the payment's transaction, in the same run.
	PeerRPS    float64 `json:"peer_redis_claim_rps"`
	PeerP99    float64 `json:"peer_redis_claim_request_p99_ms"`
	OursToPeer float64 `json:"ours_to_peer_ratio"`
	// APILogErrors counts the ERROR lines the started API logged: server
	// faults, none in a clean run.
	APILogErrors int `json:"api_log_errors"`
	// LoadBefore is the machine's 1-minute load average before the run
	// started anything: other work on it. Above Cores, the run shared the
	// machine and its ratios are noise, not findings (Noisy).
	LoadBefore float64 `json:"load_before"`
	Cores      int     `json:"cores"`
	Noisy      bool    `json:"noisy"`
	// CPUProfile is the API's CPU during the first stage's measured run
	// (when the load test started the API itself).
	CPUProfile *CPUProfile `json:"cpu_profile,omitempty"`
}

// run performs a whole load test and writes its outputs.
func run(ctx context.Context, cfg config, progress io.Writer) (*Results, error) {
	if err := requireLoopback(cfg.databaseURL); err != nil {
		return nil, fmt.Errorf("-database-url: %w", err)
	}
	if cfg.apiURL != "" {
		if err := requireLoopback(cfg.apiURL); err != nil {
			return nil, fmt.Errorf("-api-url: %w", err)
		}
	}
	if cfg.redisPeer != "" {
		if err := requireLoopback("redis://" + cfg.redisPeer); err != nil {
			return nil, fmt.Errorf("-redis-peer: %w", err)
		}
		defer removePeerKeys(cfg.redisPeer, progress)
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return nil, err
	}
	res := &Results{StartedAt: time.Now().UTC(), GoVersion: runtime.Version(), Settings: cfg.describe(), Cores: runtime.NumCPU()}
	if load, err := loadAverage(); err == nil {
		res.LoadBefore = load
		res.Noisy = load > float64(res.Cores)
		if res.Noisy {
			fmt.Fprintf(progress, "warning: the machine is busy (load average %.1f on %d cores) before the run: its ratios will not be findings\n", load, res.Cores)
		}
	}

	fmt.Fprintln(progress, "preparing the database")
	if err := claimDatabase(ctx, cfg); err != nil {
		return nil, err
	}
	adminCfg, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return nil, err
	}
	adminCfg.MaxConns = adminConns
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	// Stages must start from the sizes they claim: the load test owns this
	// database and empties it first.
	if _, err := admin.Exec(ctx, `TRUNCATE idempotency_keys, refunds, payments, idempotency_key_usage, river_job, outbox_jobs,
		events, webhook_deliveries, webhook_endpoint_leases, webhook_endpoints`); err != nil {
		return nil, fmt.Errorf("empty the tables: %w", err)
	}
	if err := describeDatabase(ctx, admin, res); err != nil {
		return nil, err
	}
	clients, err := createClients(ctx, admin, cfg.principals)
	if err != nil {
		return nil, err
	}

	apiURL := cfg.apiURL
	profile := cfg.profile && apiURL == ""
	if apiURL == "" && cfg.metricsAddr == "off" {
		// The API's CPU and allocations, and pprof, are read from its
		// metrics listener: give it a port.
		if cfg.metricsAddr, err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	if apiURL == "" {
		stop, u, err := startAPI(ctx, cfg, progress)
		if err != nil {
			return nil, err
		}
		defer stop()
		apiURL = u
	}
	if cfg.webhookLatency > 0 {
		rc, err := startReceiver(cfg.webhookLatency)
		if err != nil {
			return nil, err
		}
		defer rc.close()
		if err := registerEndpoints(ctx, apiURL, rc.url, clients); err != nil {
			return nil, err
		}
	}
	load := newLoader(admin, clients, cfg.responseBytes)
	driver := newDriver(apiURL, cfg, clients)
	// Every measured run starts with the outbox empty, so no design pays for
	// the charges of the warm-up or of the design measured before it.
	drainOrNote := func(after string) error {
		left, err := outboxDrain(ctx, admin, cfg.drain)
		if err == nil && left > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("the outbox still held %d jobs %s after %s: what was measured next shared the machine with them", left, cfg.drain, after))
		}
		return err
	}
	warmUp := func(path, label string) error {
		driver.run(ctx, path, cfg.replayFraction, cfg.warmup, nil, label)
		return drainOrNote(label)
	}

	if len(cfg.walCompression) > 0 {
		defer func() {
			if err := setWALCompression(context.WithoutCancel(ctx), admin, ""); err != nil {
				fmt.Fprintln(progress, "reset wal_compression:", err)
			}
		}()
	}
	for i, size := range cfg.sizes {
		label := fmt.Sprintf("stage %d/%d, %s rows", i+1, len(cfg.sizes), humanCount(size))
		var walCompression string
		if n := len(cfg.walCompression); n > 0 {
			walCompression = cfg.walCompression[i%n]
			if err := setWALCompression(ctx, admin, walCompression); err != nil {
				return nil, err
			}
			label += ", wal_compression " + walCompression
		}
		start := time.Now()
		if err := load.fillTo(ctx, size, progress, label); err != nil {
			return nil, err
		}
		loadSeconds := time.Since(start).Seconds()
		fmt.Fprintf(progress, "\r%s: warming up%30s", label, "")
		if err := warmUp("/v1/payments", label+" warm-up"); err != nil {
			return nil, err
		}
		// Statistics that describe the tables the run will see, as
		// autovacuum's analyze keeps them. Without this the first stage ran
		// on statistics taken of empty tables: PostgreSQL then plans the
		// service's prepared statements (pgx prepares each one per
		// connection) as sequential scans, caches those generic plans, and
		// keeps scanning the whole table as the run fills it, on a server
		// whose autovacuum is off (docs/performance.md).
		if _, err := admin.Exec(ctx, `ANALYZE idempotency_keys, payments, refunds, river_job`); err != nil {
			return nil, fmt.Errorf("analyze: %w", err)
		}
		var startRows int64
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&startRows); err != nil {
			return nil, err
		}
		updBefore, hotBefore, err := updateCounters(ctx, admin)
		if err != nil {
			return nil, err
		}
		var profiled chan profileResult
		if profile && i == 0 {
			profiled = make(chan profileResult, 1)
			go func() {
				path, err := captureProfile(ctx, cfg.metricsAddr, profileLength(cfg.duration), cfg.out)
				profiled <- profileResult{path, err}
			}()
		}
		walBefore, err := walPosition(ctx, admin)
		if err != nil {
			return nil, err
		}
		runFrom, err := dbNow(ctx, admin)
		if err != nil {
			return nil, err
		}
		counters := func() processCounters {
			if cfg.apiURL != "" {
				return processCounters{}
			}
			c, err := readCounters(ctx, cfg.metricsAddr)
			if err != nil {
				res.Notes = append(res.Notes, err.Error())
			}
			return c
		}
		c0 := counters()
		m := driver.run(ctx, "/v1/payments", cfg.replayFraction, cfg.duration, progress, label)
		c1 := counters()
		runTo, err := dbNow(ctx, admin)
		if err != nil {
			return nil, err
		}
		walAfter, err := walPosition(ctx, admin)
		if err != nil {
			return nil, err
		}
		st, err := tableStats(ctx, admin)
		if err != nil {
			return nil, err
		}
		updAfter, hotAfter, err := updateCounters(ctx, admin)
		if err != nil {
			return nil, err
		}
		st.Updates, st.HotUpdates = updAfter-updBefore, hotAfter-hotBefore
		if st.Updates > 0 {
			st.HotRatio = float64(st.HotUpdates) / float64(st.Updates)
		}
		if st.OutboxBacklog, err = outboxBacklog(ctx, admin, outbox.QueueProcessor); err != nil {
			return nil, err
		}
		if st.DeliveryBacklog, err = outboxBacklog(ctx, admin, outbox.QueueWebhooks); err != nil {
			return nil, err
		}
		// The stage's size is the table's size when the measured run began
		// (the warm-up adds a few thousand rows); the byte sizes are read at
		// its end.
		st.TableRowsEnd, st.TableRows = st.TableRows, startRows
		st.LoadSeconds = loadSeconds
		st.WALCompression = walCompression
		m.fill(&st, cfg.duration)
		if st.Requests > 0 {
			st.WALBytesPerRequest = float64(walAfter-walBefore) / float64(st.Requests)
		}
		if profiled != nil {
			r := <-profiled
			if r.err == nil {
				res.CPUProfile, r.err = summarizeProfile(ctx, r.path, profileLength(cfg.duration), st.RPS*profileLength(cfg.duration).Seconds())
			}
			if r.err != nil {
				res.Notes = append(res.Notes, fmt.Sprintf("no CPU profile: %v", r.err))
			}
		}
		// Replays alone: the stored answers of this run's keys, read back,
		// once the outbox workers have finished the stage's charges, so the
		// replays do not share the machine with them.
		drainStart := time.Now()
		if err := drainOrNote(label); err != nil {
			return nil, err
		}
		st.OutboxDrainSeconds = time.Since(drainStart).Seconds()
		drained, err := dbNow(ctx, admin)
		if err != nil {
			return nil, err
		}
		if err := chargeFigures(ctx, admin, &st, runFrom, runTo, drained); err != nil {
			return nil, err
		}
		if cfg.webhookLatency > 0 {
			if err := deliveryFigures(ctx, admin, &st, runFrom, drained); err != nil {
				return nil, err
			}
		}
		if walBefore, err = walPosition(ctx, admin); err != nil {
			return nil, err
		}
		c2 := counters()
		rm := driver.run(ctx, "/v1/payments", 1, cfg.duration, progress, label+" replays")
		c3 := counters()
		if walAfter, err = walPosition(ctx, admin); err != nil {
			return nil, err
		}
		var rs Stage
		rm.fill(&rs, cfg.duration)
		if cfg.apiURL == "" {
			st.CPUPerRequestMs, st.AllocsPerRequest = perRequest(c0, c1, st.Requests)
			st.ReplayCPUPerRequestMs, st.ReplayAllocsPerRequest = perRequest(c2, c3, rs.Requests)
		}
		if rs.Requests > 0 {
			st.ReplayWALBytesPerRequest = float64(walAfter-walBefore) / float64(rs.Requests)
		}
		st.ReplayOnlyRPS, st.ReplayOnlyP50, st.ReplayOnlyP99 = rs.RPS, rs.RequestP50, rs.RequestP99
		if st.RPS > 0 && st.RequestP99 > 0 {
			st.ReplayToNewRPS, st.ReplayToNewP99 = rs.RPS/st.RPS, rs.RequestP99/st.RequestP99
		}
		for k, v := range rs.Errors {
			st.Errors["replay "+k] += v
		}
		res.Stages = append(res.Stages, st)
		fmt.Fprintf(progress, "\r%s (measured at %s rows): %.0f req/s, request p99 %.2f ms, claim p99 %.2f ms, HOT %.0f%%, replays alone %.0f req/s (p99 %.2f ms), errors: %s\n",
			label, humanCount(st.TableRows), st.RPS, st.RequestP99, st.ClaimP99, 100*st.HotRatio, st.ReplayOnlyRPS, st.ReplayOnlyP99, errorsString(st.Errors))
		fmt.Fprintf(progress, "%s: outbox charged %.0f/s (charged/accepted %.2f), charge lag p50 %.2f s p99 %.2f s, peak backlog %d, %d left after the drain\n",
			label, st.OutboxCompletedPerSec, st.ChargedToAccepted, st.ChargeLagP50, st.ChargeLagP99, st.PeakBacklog, st.ChargesLeft)
		if cfg.webhookLatency > 0 {
			fmt.Fprintf(progress, "%s: webhooks delivered %d, lag p50 %.2f s p99 %.2f s, %d left after the drain\n",
				label, st.Deliveries-st.DeliveriesLeft, st.DeliveryLagP50, st.DeliveryLagP99, st.DeliveriesLeft)
		}

		if i > 0 {
			continue
		}
		res.IdempotentRPS = st.RPS
		if cfg.baseline || cfg.redisPeer != "" || cfg.pgbench {
			if err := compareDesigns(ctx, cfg, res, driver, clients, warmUp, drainOrNote, progress); err != nil {
				return nil, err
			}
		}
	}
	if cfg.apiURL == "" {
		// What the server said about the run: the service logs server
		// faults at ERROR, so any here is worth reading in api.log.
		if raw, err := os.ReadFile(filepath.Join(cfg.out, "api.log")); err == nil {
			res.APILogErrors = strings.Count(string(raw), `"level":"ERROR"`)
		}
	}
	// The designs measured after the last stage leave charges behind too.
	if err := drainOrNote("the last run"); err != nil {
		return nil, err
	}
	if err := writeOutputs(cfg.out, res); err != nil {
		return nil, err
	}
	return res, nil
}

// loadAverage is the machine's 1-minute load average (Linux).
func loadAverage() (float64, error) {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(raw), " ")
	return strconv.ParseFloat(first, 64)
}

// setWALCompression sets the server's wal_compression (ALTER SYSTEM, then a
// reload, which every session picks up), or resets it when v is empty. A
// checkpoint follows, so that the stage starts, like every stage, with
// every page's next change paying a full-page image.
func setWALCompression(ctx context.Context, admin *pgxpool.Pool, v string) error {
	stmt := `ALTER SYSTEM RESET wal_compression`
	if v != "" {
		stmt = `ALTER SYSTEM SET wal_compression = '` + v + `'` // v is one of the values parseFlags allows
	}
	for _, q := range []string{stmt, `SELECT pg_reload_conf()`, `CHECKPOINT`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("wal_compression %q: %s: %w", v, q, err)
		}
	}
	return nil
}

// walPosition is the server's WAL insert position in bytes.
func walPosition(ctx context.Context, admin *pgxpool.Pool) (int64, error) {
	var lsn int64
	err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&lsn)
	if err != nil {
		return 0, fmt.Errorf("wal position: %w", err)
	}
	return lsn, nil
}

// profileResult is a captured CPU profile's file.
type profileResult struct {
	path string
	err  error
}

// profileLength covers the measured run but its last second, so the profile
// holds nothing of what follows.
func profileLength(d time.Duration) time.Duration {
	return max(time.Second, d-time.Second).Truncate(time.Second)
}

// freeLoopbackAddr is a loopback address with a port free right now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// requireLoopback refuses any target that is not on this machine.
func requireLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address: the load test only targets this machine", host)
	}
	return nil
}

// client is one principal with its API key.
type client struct {
	principal string
	secret    string
	hash      []byte
}

func createClients(ctx context.Context, admin *pgxpool.Pool, n int) ([]client, error) {
	out := make([]client, 0, n)
	for i := range n {
		var k auth.NewKey
		err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) (err error) {
			k, err = auth.CreateKey(ctx, tx, fmt.Sprintf("loadtest-%03d", i), []string{auth.ScopePaymentsWrite, auth.ScopeWebhooksWrite})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("create load test key: %w", err)
		}
		out = append(out, client{principal: k.PrincipalID.String(), secret: k.Secret, hash: sha256Sum(k.Secret)})
	}
	return out, nil
}

// startAPI builds the load test's server (loadtest/server: the service as
// `api serve` runs it, plus the baseline and peer routes and the claim's
// Server-Timing) and runs it on a free loopback port.
func startAPI(ctx context.Context, cfg config, progress io.Writer) (stop func(), apiURL string, err error) {
	dir, err := os.MkdirTemp("", "loadtest-api")
	if err != nil {
		return nil, "", err
	}
	bin := filepath.Join(dir, "api")
	fmt.Fprintln(progress, "building the load test's server (the service, plus its baseline and peer routes)")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/payments-reference/idempotent-payments/loadtest/server")
	build.Stderr = progress
	if err := build.Run(); err != nil {
		return nil, "", fmt.Errorf("build loadtest/server: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := l.Addr().String()
	l.Close()

	appURL, maintURL := cfg.appDatabaseURL, cfg.maintenanceURL
	if appURL == "" {
		appURL = database.WithUser(cfg.databaseURL, "payments_app")
	}
	if maintURL == "" {
		maintURL = database.WithUser(cfg.databaseURL, "payments_maintenance")
	}
	logFile, err := os.Create(filepath.Join(cfg.out, "api.log"))
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"ADDR="+addr,
		"METRICS_ADDR="+cfg.metricsAddr,
		"PPROF=true",
		"DATABASE_URL="+appURL,
		"MAINTENANCE_DATABASE_URL="+maintURL,
		"MIGRATE_ON_START=false",
		"LOADTEST_REDIS_PEER="+cfg.redisPeer,
		"LOG_LEVEL=warn",
		fmt.Sprintf("DB_MAX_CONNS=%d", cfg.dbMaxConns),
		"LOADTEST_PROCESSOR_LATENCY="+cfg.processorLatency.String(),
		"LOADTEST_PROCESSOR_LATENCY_P99="+cfg.processorLatencyP99.String(),
		fmt.Sprintf("OUTBOX_WORKERS=%d", cfg.outboxWorkers),
		fmt.Sprintf("OUTBOX_DB_MAX_CONNS=%d", cfg.outboxConns),
		// It measures the key store, not the rate limits.
		"RATE_LIMIT=0", "RATE_LIMIT_UNAUTHENTICATED=0",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start api: %w", err)
	}
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		os.RemoveAll(dir)
	}
	apiURL = "http://" + addr
	if err := waitReady(ctx, apiURL); err != nil {
		stop()
		return nil, "", err
	}
	return stop, apiURL, nil
}

func tableStats(ctx context.Context, admin *pgxpool.Pool) (Stage, error) {
	var s Stage
	err := admin.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM idempotency_keys),
		       pg_table_size('idempotency_keys'),
		       pg_relation_size('idempotency_keys_pkey'),
		       pg_indexes_size('idempotency_keys')`).Scan(&s.TableRows, &s.TableBytes, &s.IndexBytes, &s.AllIndexBytes)
	if err != nil {
		return Stage{}, fmt.Errorf("table stats: %w", err)
	}
	return s, nil
}

func describeDatabase(ctx context.Context, admin *pgxpool.Pool, res *Results) error {
	if err := admin.QueryRow(ctx, `SELECT version()`).Scan(&res.PostgresVersion); err != nil {
		return err
	}
	res.PostgresSettings = map[string]string{}
	rows, err := admin.Query(ctx, `
		SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings
		WHERE name IN ('shared_buffers', 'effective_cache_size', 'work_mem', 'max_connections', 'fsync',
		               'synchronous_commit', 'wal_level', 'max_wal_size', 'checkpoint_timeout', 'autovacuum',
		               'random_page_cost', 'full_page_writes', 'wal_compression')`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return err
		}
		res.PostgresSettings[k] = v
	}
	if err := rows.Err(); err != nil {
		return err
	}
	res.Machine = machineInfo()
	return nil
}

var errNotReady = errors.New("api did not become ready")

// removePeerKeys deletes the keys the peer design wrote to Redis in this
// run, so a shared Redis is left as it was found.
func removePeerKeys(addr string, progress io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	iter := rdb.Scan(ctx, 0, designs.PeerKeyPrefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			_ = rdb.Unlink(ctx, batch...).Err()
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		_ = rdb.Unlink(ctx, batch...).Err()
	}
	if err := iter.Err(); err != nil {
		fmt.Fprintln(progress, "remove the peer's Redis keys:", err)
	}
}

// errNotOurs refuses a database the load test did not create.
var errNotOurs = errors.New("the load test empties its database, and did not create this one")

// claimDatabase makes sure the load test may empty the database at
// -database-url: it creates it when missing and marks it as its own; a
// database that exists without the mark is refused, unless -take-over.
// Then it applies the migrations.
func claimDatabase(ctx context.Context, cfg config) error {
	pc, err := pgx.ParseConfig(cfg.databaseURL)
	if err != nil {
		return err
	}
	existed := true
	if conn, err := pgx.ConnectConfig(ctx, pc); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
			return fmt.Errorf("connect: %w", err)
		}
		existed = false
	} else {
		var marked bool
		err := conn.QueryRow(ctx, `SELECT to_regclass('loadtest_marker') IS NOT NULL`).Scan(&marked)
		conn.Close(ctx)
		if err != nil {
			return err
		}
		if !marked && !cfg.takeOver {
			return fmt.Errorf("%w: database %q exists and is not marked as the load test's (table loadtest_marker); name another with -database-url, or pass -take-over to let the load test own and empty it", errNotOurs, pc.Database)
		}
	}
	if !existed {
		if err := database.EnsureDatabase(ctx, cfg.databaseURL); err != nil {
			return err
		}
	}
	if err := database.Migrate(ctx, cfg.databaseURL); err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS loadtest_marker (created_at timestamptz NOT NULL DEFAULT now());
		COMMENT ON TABLE loadtest_marker IS 'go run ./loadtest owns this database and empties it on every run'`)
	return err
}
