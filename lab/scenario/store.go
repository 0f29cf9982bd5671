package scenario

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/httpapi"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// 5. Claims in a Redis that evicts under memory pressure (allkeys-lru): at
// peak, claims are evicted and their retries execute again. The scenario
// starts a private redis-server with a 1 MiB limit, so the machine's Redis
// is never reconfigured.
func redisEviction(ctx context.Context, l *Lab) (Outcome, error) {
	rdb, stop, err := privateRedis(ctx, "1mb", "allkeys-lru")
	if err != nil {
		return Outcome{}, err
	}
	defer stop()
	const intents = 300
	naiveKey := func(i int) string { return l.key("lru-naive-" + strconv.Itoa(i)) }
	attempt := func(i int) error {
		taken, err := rdb.SetNX(ctx, "claim:"+naiveKey(i), "done", time.Hour).Result()
		if err != nil || !taken {
			return err
		}
		_, err = l.naivePay(ctx, "A", naiveKey(i))
		return err
	}
	for i := range intents {
		if err := attempt(i); err != nil {
			return Outcome{}, err
		}
	}
	// Peak: the rest of the application fills the cache.
	filler := strings.Repeat("x", 2048)
	for i := range 2000 {
		if err := rdb.Set(ctx, "session:"+strconv.Itoa(i), filler, time.Hour).Err(); err != nil {
			return Outcome{}, err
		}
	}
	for i := range intents { // every intent's retry
		if err := attempt(i); err != nil {
			return Outcome{}, err
		}
	}
	var naive int
	if err := l.admin.QueryRow(ctx, `SELECT count(*) - count(DISTINCT intent) FROM lab_naive_payments WHERE intent LIKE $1`, l.key("lru-naive-")+"%").Scan(&naive); err != nil {
		return Outcome{}, err
	}

	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	for range 2 { // every intent, then its retry
		for i := range intents {
			if _, err := l.pay(ctx, e, principal, l.key("lru-ours-"+strconv.Itoa(i)), 1000); err != nil {
				return Outcome{}, err
			}
		}
	}
	var ours int
	if err := l.admin.QueryRow(ctx, `SELECT count(*) - count(DISTINCT metadata->>'intent') FROM payments WHERE metadata->>'intent' LIKE $1`, l.key("lru-ours-")+"%").Scan(&ours); err != nil {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      fmt.Sprintf("%s of %s intents paid twice after their claims were evicted", num(naive), num(intents)),
		Ours:       fmt.Sprintf("%s duplicates of %s: PostgreSQL does not evict a committed row", num(ours), num(intents)),
		NaiveBroke: naive > 0, OursHeld: ours == 0,
		Shown: fmt.Sprintf("naive: %s duplicates; ours: %s", num(naive), num(ours)),
	}, nil
}

// privateRedis starts a redis-server on a free loopback port with the given
// memory limit and policy, persisting nothing.
func privateRedis(ctx context.Context, maxmemory, policy string) (*redis.Client, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--maxmemory", maxmemory, "--maxmemory-policy", policy)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start redis-server (the eviction scenario needs the binary, e.g. apt-get install redis-server): %w", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port})
	for range 100 {
		if rdb.Ping(ctx).Err() == nil {
			return rdb, func() { rdb.Close(); stop() }, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	rdb.Close()
	stop()
	return nil, nil, errors.New("private redis-server did not answer")
}

// fillKeys inserts rows keys into table (idempotency_keys or a copy of it)
// for one principal, made for the purpose (the sweeper walks principals),
// with the first expiredShare of them already expired. It returns the
// principal.
func (l *Lab) fillKeys(ctx context.Context, table string, rows int, expiredShare float64) (uuid.UUID, error) {
	principal := uuid.New()
	_, err := l.admin.Exec(ctx, `
		WITH p AS (INSERT INTO principals (id, name) VALUES ($1::uuid, 'lab-' || $1::uuid::text) RETURNING id)
		INSERT INTO `+table+` (principal_id, endpoint, key, state, fingerprint, response_status, response_content_type, response_body, correlation_id, created_at, expires_at)
		SELECT p.id, 'POST /v1/payments', 'k' || g, 'completed', sha256(g::text::bytea), 201, 'application/json', '\x7b7d', 'req',
		       now() - interval '30 hours',
		       CASE WHEN g <= $3 THEN now() - interval '1 hour' ELSE now() + interval '20 hours' END
		FROM p, generate_series(1, $2) g`, principal, rows, int(float64(rows)*expiredShare))
	if err != nil {
		return uuid.Nil, fmt.Errorf("fill %s: %w", table, err)
	}
	_, err = l.admin.Exec(ctx, `ANALYZE `+table)
	return principal, err
}

var (
	executionTime = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)
	removedRows   = regexp.MustCompile(`Rows Removed by Filter: ([0-9]+)`)
)

// explainChunk runs one sweep chunk's DELETE of principal's keys on table
// under EXPLAIN ANALYZE, rolled back, and returns its plan and time.
func (l *Lab) explainChunk(ctx context.Context, table string, principal uuid.UUID) (plan string, ms float64, err error) {
	sql := `EXPLAIN (ANALYZE, COSTS OFF) DELETE FROM ` + table + ` k USING (
		SELECT principal_id, endpoint, key FROM ` + table + ` WHERE principal_id = $1 AND expires_at < now() ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED
	) expired WHERE k.principal_id = $1 AND k.endpoint = expired.endpoint AND k.key = expired.key AND k.expires_at < now()`
	err = pgx.BeginFunc(ctx, l.admin, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, principal)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		plan = strings.Join(lines, "\n")
		if err == nil {
			err = errRollback
		}
		return err
	})
	if !errors.Is(err, errRollback) {
		return "", 0, err
	}
	m := executionTime.FindStringSubmatch(plan)
	if m == nil {
		return plan, 0, errors.New("no execution time in the plan")
	}
	ms, err = strconv.ParseFloat(m[1], 64)
	return plan, ms, err
}

var errRollback = errors.New("rolled back on purpose")

// 7. Expiry without an index on (principal_id, expires_at): every chunk of
// the sweep reads all of the principal's keys, live ones included, to find
// the expired ones.
func expiryWithoutIndex(ctx context.Context, l *Lab) (Outcome, error) {
	if _, err := l.admin.Exec(ctx, `
		DROP TABLE IF EXISTS lab_keys_noindex;
		CREATE TABLE lab_keys_noindex (LIKE idempotency_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS, PRIMARY KEY (principal_id, endpoint, key));
		TRUNCATE idempotency_keys;`); err != nil {
		return Outcome{}, err
	}
	rows := l.env.Rows
	naivePrincipal, err := l.fillKeys(ctx, "lab_keys_noindex", rows, 0.1)
	if err != nil {
		return Outcome{}, err
	}
	ourPrincipal, err := l.fillKeys(ctx, "idempotency_keys", rows, 0.1)
	if err != nil {
		return Outcome{}, err
	}
	naivePlan, naiveMs, err := l.explainChunk(ctx, "lab_keys_noindex", naivePrincipal)
	if err != nil {
		return Outcome{}, err
	}
	ourPlan, ourMs, err := l.explainChunk(ctx, "idempotency_keys", ourPrincipal)
	if err != nil {
		return Outcome{}, err
	}
	naiveRead, naiveScans := rowsReadAndDropped(naivePlan)
	ourRead, _ := rowsReadAndDropped(ourPlan)
	indexed := strings.Contains(ourPlan, "idempotency_keys_expires_at_idx")
	return Outcome{
		Naive: fmt.Sprintf("one 1,000-row chunk, in a table of %s keys, read and dropped %s live rows%s, %.1f ms",
			num(rows), num(naiveRead), perScan(naiveScans), naiveMs),
		Ours:       fmt.Sprintf("the same chunk: %s, %s live rows read, %.1f ms", verdict(indexed, "Index Scan on (principal_id, expires_at)", "no index scan"), num(ourRead), ourMs),
		NaiveBroke: naiveRead >= rows/2, OursHeld: indexed && ourRead == 0 && ourMs < naiveMs,
		Shown: fmt.Sprintf("naive: %s live rows read per scan; ours: %s", num(naiveRead), num(ourRead)),
	}, nil
}

// perScan says that a figure counts each of several scans once.
func perScan(scans int) string {
	if scans < 2 {
		return ""
	}
	return fmt.Sprintf(" in each of its %d scans", scans)
}

// rowsReadAndDropped reads a plan's "Rows Removed by Filter" (rows a scan
// read only to find they did not qualify): the most any one scan dropped,
// and how many scans dropped any. A sum would count the same live rows once
// per scan (the chunk's DELETE reads the table twice without the index),
// and exceed the table.
func rowsReadAndDropped(plan string) (most, scans int) {
	for _, m := range removedRows.FindAllStringSubmatch(plan, -1) {
		v, _ := strconv.Atoi(m[1])
		if v > 0 {
			most, scans = max(most, v), scans+1
		}
	}
	return most, scans
}

// 8. One DELETE of every expired row: its locks are held, and its WAL
// written, in one go; the sweeper deletes in chunks of 1,000 rows, each
// its own short transaction.
func unboundedDelete(ctx context.Context, l *Lab) (Outcome, error) {
	rows := l.env.Rows
	if _, err := l.admin.Exec(ctx, `
		DROP TABLE IF EXISTS lab_keys_unbounded;
		CREATE TABLE lab_keys_unbounded (LIKE idempotency_keys INCLUDING ALL);
		TRUNCATE idempotency_keys;`); err != nil {
		return Outcome{}, err
	}
	if _, err := l.fillKeys(ctx, "lab_keys_unbounded", rows, 0.5); err != nil {
		return Outcome{}, err
	}
	if _, err := l.fillKeys(ctx, "idempotency_keys", rows, 0.5); err != nil {
		return Outcome{}, err
	}
	var lsn0, lsn1 string
	if err := l.admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
		return Outcome{}, err
	}
	start := time.Now()
	tag, err := l.admin.Exec(ctx, `DELETE FROM lab_keys_unbounded WHERE expires_at < now()`)
	if err != nil {
		return Outcome{}, err
	}
	naiveHold := time.Since(start)
	if err := l.admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn1); err != nil {
		return Outcome{}, err
	}
	naiveWAL, err := l.walBetween(ctx, lsn0, lsn1)
	if err != nil {
		return Outcome{}, err
	}

	sweeper, err := idempotency.NewSweeper(l.maint, idempotency.SweeperConfig{Chunk: 1000, Pause: 10 * time.Millisecond, Retention: window})
	if err != nil {
		return Outcome{}, err
	}
	var maxChunk time.Duration
	var chunks, maxRows int64
	sweeper.OnChunk = func(rows int64, took time.Duration) {
		chunks++
		maxChunk = max(maxChunk, took)
		maxRows = max(maxRows, rows)
	}
	if err := l.admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
		return Outcome{}, err
	}
	deleted, err := sweeper.Sweep(ctx)
	if err != nil {
		return Outcome{}, err
	}
	if err := l.admin.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn1); err != nil {
		return Outcome{}, err
	}
	ourWAL, err := l.walBetween(ctx, lsn0, lsn1)
	if err != nil {
		return Outcome{}, err
	}
	// The verdicts are structural: how many rows one transaction held
	// locked. The times and WAL are reported; the lock time of the one
	// statement grows with the rows it deletes, a chunk's does not
	// (docs/lab.md shows both at a few million rows).
	return Outcome{
		Naive: fmt.Sprintf("one transaction locked all %s rows (it took %s; %.1f MB WAL at once)", num(tag.RowsAffected()), naiveHold.Round(time.Millisecond), naiveWAL/1e6),
		Ours: fmt.Sprintf("no transaction locked more than %s rows (%s rows in %s chunks; longest %s; %.1f MB WAL over the sweep)",
			num(maxRows), num(deleted), num(chunks), maxChunk.Round(time.Millisecond), ourWAL/1e6),
		Shown:      fmt.Sprintf("naive: %s rows locked by one transaction; ours: at most %s", num(tag.RowsAffected()), num(maxRows)),
		NaiveBroke: tag.RowsAffected() >= 10*1000,
		OursHeld:   deleted == tag.RowsAffected() && maxRows <= 1000,
		Structural: "rows one transaction locks. At small sizes the one statement can be quicker, but its lock time grows with the rows it deletes and a chunk's does not (521 ms against 48 ms at 1,000,000 rows: docs/lab.md)",
	}, nil
}

func (l *Lab) walBetween(ctx context.Context, from, to string) (float64, error) {
	var b float64
	err := l.admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8`, from, to).Scan(&b)
	return b, err
}

// 10. A replay served before authentication: a revoked API key still gets
// the stored response. Ours runs the real HTTP API, which authenticates
// every request, replays included.
func noReauthorization(ctx context.Context, l *Lab) (Outcome, error) {
	var key, readOnly auth.NewKey
	err := pgx.BeginFunc(ctx, l.admin, func(tx pgx.Tx) (err error) {
		if key, err = auth.CreateKey(ctx, tx, "lab-"+l.prefix, []string{auth.ScopePaymentsWrite}); err != nil {
			return err
		}
		// A second key of the same principal that may only read.
		readOnly, err = auth.CreateKey(ctx, tx, "lab-"+l.prefix, []string{auth.ScopePaymentsRead})
		return err
	})
	if err != nil {
		return Outcome{}, err
	}
	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Deps{Pool: l.app, Idempotency: e, Outbox: l.jobs,
		MaxBodyBytes: 1 << 20, RequestTimeout: 10 * time.Second, Logger: discardLogger()}))
	defer srv.Close()
	post := func(secret string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{"amount":1000,"currency":"usd"}`))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Idempotency-Key", l.key("reauth"))
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if status, err := post(key.Secret); err != nil || status != http.StatusCreated {
		return Outcome{}, fmt.Errorf("first payment: %d %v", status, err)
	}
	// The naive build's cache of responses by key, filled by that request.
	naiveCache := map[string]int{l.key("reauth"): http.StatusCreated}
	if err := auth.RevokeKey(ctx, l.admin, key.ID); err != nil {
		return Outcome{}, err
	}
	naiveStatus := naiveCache[l.key("reauth")] // looked up before any authentication
	revoked, err := post(key.Secret)
	if err != nil {
		return Outcome{}, err
	}
	readOnlyStatus, err := post(readOnly.Secret)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      fmt.Sprintf("revoked key and read-only key both replayed: %d with the stored payment", naiveStatus),
		Ours:       fmt.Sprintf("revoked key: %d; read-only key: %d; the stored response not shown", revoked, readOnlyStatus),
		Shown:      fmt.Sprintf("naive: replayed %d to a revoked key; ours: %d, %d", naiveStatus, revoked, readOnlyStatus),
		NaiveBroke: naiveStatus == http.StatusCreated,
		OursHeld:   revoked == http.StatusUnauthorized && readOnlyStatus == http.StatusForbidden,
	}, nil
}

// 11. Every response stored whole: one verbose endpoint fills the key table.
// Ours stores responses up to MAX_STORED_RESPONSE_BYTES and, above it, a
// reference from which a replay re-derives the response.
func uncappedResponses(ctx context.Context, l *Lab) (Outcome, error) {
	const n, size = 100, 200 << 10
	verbose := func() string {
		b := make([]byte, size*3/4)
		_, _ = rand.Read(b)
		return base64.StdEncoding.EncodeToString(b) // incompressible, as TOAST sees it
	}
	for i := range n {
		if _, err := l.admin.Exec(ctx, `INSERT INTO lab_naive_keys (key, response) VALUES ($1, $2)`, l.key("verbose-naive-"+strconv.Itoa(i)), verbose()); err != nil {
			return Outcome{}, err
		}
	}
	var naiveBytes int64
	if err := l.admin.QueryRow(ctx, `SELECT coalesce(sum(pg_column_size(response)), 0) FROM lab_naive_keys WHERE key LIKE $1`, l.key("verbose-naive-")+"%").Scan(&naiveBytes); err != nil {
		return Outcome{}, err
	}

	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	for i := range n {
		body := []byte(verbose())
		ref := uuid.NewString()
		_, err := e.Do(ctx, idempotency.Request{
			Authenticate: principal.authenticate,
			Scope:        idempotency.Scope{Endpoint: "POST /v1/reports", Key: l.key("verbose-ours-" + strconv.Itoa(i))},
			Fingerprint:  idempotency.Fingerprint("POST", "/v1/reports", nil),
			RequestID:    "req_verbose",
		}, idempotency.Operation{
			Execute: func(context.Context, idempotency.Work) (idempotency.Outcome, error) {
				return idempotency.Outcome{Response: idempotency.Response{Status: 201, ContentType: "application/json", Body: body}, ResourceRef: ref}, nil
			},
			// A replay renders the report again from what it names.
			Rederive: func(_ context.Context, _ pgx.Tx, _ uuid.UUID, ref string) ([]byte, error) {
				return []byte(`{"report":"` + ref + `"}`), nil
			},
		})
		if err != nil {
			return Outcome{}, err
		}
	}
	var ourBytes int64
	if err := l.admin.QueryRow(ctx, `SELECT coalesce(sum(coalesce(pg_column_size(response_body), 0) + coalesce(pg_column_size(response_ref), 0)), 0)
		FROM idempotency_keys WHERE key LIKE $1`, l.key("verbose-ours-")+"%").Scan(&ourBytes); err != nil {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      fmt.Sprintf("%s responses of %s KiB: %s KiB stored", num(n), num(size>>10), num(naiveBytes>>10)),
		Ours:       fmt.Sprintf("capped at 64 KiB, references stored: %s KiB", num(ourBytes>>10)),
		Shown:      fmt.Sprintf("naive: %s KiB stored; ours: %s KiB", num(naiveBytes>>10), num(ourBytes>>10)),
		NaiveBroke: naiveBytes > int64(n*size/2), OursHeld: ourBytes*100 < naiveBytes,
	}, nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
