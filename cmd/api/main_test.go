package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/config"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestKeysCreateAndRevoke(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 1)
	getenv := env(map[string]string{"DATABASE_URL": db.AppURL, "MIGRATE_DATABASE_URL": db.OwnerURL})
	ctx := context.Background()

	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:write,payments:read"}, getenv, &out))
	require.Equal(t, 1, strings.Count(out.String(), "\n"), "one line of JSON")
	var key struct {
		ID          string   `json:"id"`
		PrincipalID string   `json:"principal_id"`
		Principal   string   `json:"principal"`
		Scopes      []string `json:"scopes"`
		Secret      string   `json:"secret"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &key))
	require.Equal(t, "acme", key.Principal)
	require.Equal(t, []string{"payments:read", "payments:write"}, key.Scopes)
	require.True(t, strings.HasPrefix(key.Secret, "sk_"))
	require.NotEmpty(t, key.ID)

	// A second key for the same name belongs to the same principal.
	out.Reset()
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "refunds:read"}, getenv, &out))
	require.Contains(t, out.String(), key.PrincipalID)

	out.Reset()
	require.NoError(t, run(ctx, []string{"keys", "revoke", key.ID}, getenv, &out))
	require.Contains(t, out.String(), `"revoked":true`)

	// keys list shows both keys, the revoked one as such, and no secret.
	out.Reset()
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "other", "--scopes", "payments:read"}, getenv, &out))
	out.Reset()
	require.NoError(t, run(ctx, []string{"keys", "list", "--principal", "acme"}, getenv, &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	var listed struct {
		ID        string  `json:"id"`
		Principal string  `json:"principal"`
		RevokedAt *string `json:"revoked_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &listed))
	require.Equal(t, key.ID, listed.ID)
	require.Equal(t, "acme", listed.Principal)
	require.NotNil(t, listed.RevokedAt)
	// Revoking again succeeds and keeps the first revocation's time.
	require.NoError(t, run(ctx, []string{"keys", "revoke", key.ID}, getenv, io.Discard))
	var again bytes.Buffer
	require.NoError(t, run(ctx, []string{"keys", "list", "--principal", "acme"}, getenv, &again))
	require.Contains(t, again.String(), *listed.RevokedAt)
	require.NotContains(t, out.String(), "sk_")
	require.NotContains(t, out.String(), "secret")
	out.Reset()
	require.NoError(t, run(ctx, []string{"keys", "list"}, getenv, &out))
	require.Equal(t, 3, strings.Count(out.String(), "\n"), "every principal's keys")

	require.Error(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:everything"}, getenv, &out))
	require.Error(t, run(ctx, []string{"keys", "revoke", "01a237a6-1ce6-7a98-be43-37d8ff4b5115"}, getenv, &out))
}

func TestSweepReportsWhatItDeleted(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 3) // admin, and the sweep's maintenance pool of 2
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `
		WITH p AS (INSERT INTO principals (id, name) VALUES (gen_random_uuid(), 'acme') RETURNING id)
		INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, response_status, response_body, correlation_id, created_at, expires_at)
		SELECT p.id, 'POST /v1/payments', 'k' || i, 'completed', sha256(''), 201, '{}', 'req', now() - interval '2 days', now() - interval '1 hour'
		FROM p, generate_series(1, 25) i`)
	require.NoError(t, err)

	var out bytes.Buffer
	getenv := env(map[string]string{"MAINTENANCE_DATABASE_URL": db.MaintenanceURL, "SWEEP_CHUNK": "10"})
	require.NoError(t, run(ctx, []string{"sweep"}, getenv, &out))
	var report map[string]float64
	require.NoError(t, json.Unmarshal(out.Bytes(), &report))
	require.EqualValues(t, 25, report["deleted"])
}

func TestInvalidConfigStopsTheProgram(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"serve"}, env(map[string]string{"LOCK_TIMEOUT": "soon", "DB_MAX_CONNS": "0"}), &bytes.Buffer{})
	require.ErrorContains(t, err, "LOCK_TIMEOUT")
	require.ErrorContains(t, err, "DB_MAX_CONNS")
}

// serve migrates, listens, answers, exposes its metrics under the names
// Prometheus users query, and stops cleanly when its context ends (SIGTERM).
func TestServe(t *testing.T) {
	t.Parallel()
	// The service pool (4), the outbox's (2), the maintenance pool (3), the
	// owner connection of migrations and `keys create`, and one admin
	// connection.
	db := testdb.New(t, 11)
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	getenv := env(map[string]string{
		"ADDR": addr, "METRICS_ADDR": metricsAddr, "DB_MAX_CONNS": "4", "OUTBOX_DB_MAX_CONNS": "2",
		"DATABASE_URL": db.AppURL, "MIGRATE_DATABASE_URL": db.OwnerURL, "MAINTENANCE_DATABASE_URL": db.MaintenanceURL,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs syncBuffer
	go func() { done <- runLogging(ctx, nil, getenv, io.Discard, &logs) }()
	waitOK(t, "http://"+addr+"/readyz")
	// Without PROCESSOR_URL no money moves, and the log says so loudly.
	require.Contains(t, logs.String(), `"level":"WARN","msg":"TEST MODE: PROCESSOR_URL is unset`)

	// The container healthcheck's subcommand finds the running API, and
	// fails where none listens.
	require.NoError(t, run(ctx, []string{"healthcheck"}, getenv, &bytes.Buffer{}))
	require.Error(t, run(ctx, []string{"healthcheck"}, env(map[string]string{"ADDR": freeAddr(t)}), &bytes.Buffer{}))

	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:write"}, getenv, &out))
	var key struct{ Secret string }
	require.NoError(t, json.Unmarshal(out.Bytes(), &key))
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(`{"amount": 1, "currency": "usd"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key.Secret)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	created, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Contains(t, string(created), `"livemode":false`, "the simulator's payments say they moved no money")

	// What serve stores is the published window plus the margin, 24h + 1h
	// by default: the promise in openapi.yaml, kept by the running binary.
	admin, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var kept time.Duration
	require.NoError(t, admin.QueryRow(ctx, `SELECT expires_at - created_at FROM idempotency_keys`).Scan(&kept))
	require.Equal(t, 25*time.Hour, kept)

	resp, err = http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, name := range []string{
		`idempotency_requests_total{endpoint="POST /v1/payments",outcome="claimed"`,
		`idempotency_claim_duration_seconds_bucket{endpoint="POST /v1/payments"`,
		"idempotency_keys_rows", "idempotency_keys_bytes", "idempotency_oldest_live_key_age_seconds",
		"idempotency_sweeper_deleted_rows_total", "idempotency_sweeper_last_run_timestamp_seconds",
		"http_server_request_duration_seconds", `http_route="/v1/payments"`,
		"processor_livemode 0", "reconciliation_waiting", "reconciliation_oldest_waiting_age_seconds",
		"outbox_relay_waiting", "outbox_relay_oldest_age_seconds",
	} {
		require.Contains(t, string(body), name)
	}
	// Without ADMIN_PASSWORD, River UI is not served at all.
	resp, err = http.Get("http://" + metricsAddr + "/riverui/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(25 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
}

// A fork deployed with APP_ENV=production cannot charge the simulator, hold
// the owner's credentials while serving, sign webhooks with the published
// development key, or send them into its own network; and serve has no
// fault switches.
func TestProductionRefusesTestModeAndOwnerCredentials(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"APP_ENV": "production"}, "APP_ENV=production needs PROCESSOR_URL"},
		{map[string]string{"APP_ENV": "production", "PROCESSOR_URL": "http://processor", "MIGRATE_ON_START": "true"}, "APP_ENV=production refuses MIGRATE_ON_START=true"},
		{map[string]string{"APP_ENV": "production", "PROCESSOR_URL": "http://processor"}, "APP_ENV=production needs WEBHOOK_SIGNING_KEY"},
		{map[string]string{"APP_ENV": "production", "PROCESSOR_URL": "http://processor", "WEBHOOK_ALLOW_PRIVATE_URLS": "true"}, "APP_ENV=production refuses WEBHOOK_ALLOW_PRIVATE_URLS=true"},
		{map[string]string{"WEBHOOK_SIGNING_KEY": "c2hvcnQ="}, "WEBHOOK_SIGNING_KEY: want the standard base64 of at least 32 random bytes"},
		{map[string]string{"WEBHOOK_RETRY_SCHEDULE": "0s,soon"}, `WEBHOOK_RETRY_SCHEDULE="0s,soon"`},
		{map[string]string{"APP_ENV": "staging"}, `APP_ENV="staging"`},
		{map[string]string{"PROCESSOR_SIM_DROP_RATE": "0.5"}, "PROCESSOR_SIM_* configure `api processor-sim` only"},
	} {
		err := run(context.Background(), []string{"serve"}, env(tc.vars), &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, "%v", tc.vars)
	}
	// `api reconcile` asks a real ledger or nothing.
	err := run(context.Background(), []string{"reconcile"}, env(nil), &bytes.Buffer{})
	require.ErrorContains(t, err, "api reconcile needs a processor")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// A service role that cannot connect does not start silently: the log says
// so at once, while the service still starts (and answers /healthz).
func TestServeSaysWhenTheDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	getenv := env(map[string]string{
		"ADDR": addr, "METRICS_ADDR": "off", "MIGRATE_ON_START": "false", "OUTBOX_WORKERS": "0",
		"DATABASE_URL":             "postgres://payments_app@127.0.0.1:1/payments?sslmode=disable",
		"MAINTENANCE_DATABASE_URL": "postgres://payments_maintenance@127.0.0.1:1/payments?sslmode=disable",
	})
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() { done <- runLogging(ctx, nil, getenv, io.Discard, &logs) }()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "cannot reach the database") }, 10*time.Second, 20*time.Millisecond)
	// The warning can come before the listener is up: wait for it.
	waitOK(t, "http://"+addr+"/healthz")
	cancel()
	require.NoError(t, <-done)
}

// waitOK polls url until it answers 200, for up to 10 s.
func waitOK(t *testing.T, url string) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "%s never answered 200", url)
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A body that arrives more slowly than BODY_TIMEOUT gets 408 on the wire,
// not a closed connection or a 503: the server's deadlines are ordered read
// < request < write.
func TestASlowBodyGets408(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 11) // a serving process, as TestServe's
	addr := freeAddr(t)
	getenv := env(map[string]string{
		"ADDR": addr, "METRICS_ADDR": "off", "DB_MAX_CONNS": "4", "OUTBOX_DB_MAX_CONNS": "2", "BODY_TIMEOUT": "1s", "REQUEST_TIMEOUT": "3s", "LOCK_TIMEOUT": "1s",
		"DATABASE_URL": db.AppURL, "MIGRATE_DATABASE_URL": db.OwnerURL, "MAINTENANCE_DATABASE_URL": db.MaintenanceURL,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runLogging(ctx, nil, getenv, io.Discard, io.Discard) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	waitOK(t, "http://"+addr+"/readyz")
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:write"}, getenv, &out))
	var key struct{ Secret string }
	require.NoError(t, json.Unmarshal(out.Bytes(), &key))

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	body := `{"amount": 1000, "currency": "usd"}`
	_, err = fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: slow\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		key.Secret, len(body), body[:10])
	require.NoError(t, err)
	// The rest of the body never comes in time.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no response on the wire")
	defer resp.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
}

// Help works for the binary and every subcommand, exits 0, even with a broken
// environment, and lists every setting with its default.
func TestHelp(t *testing.T) {
	t.Parallel()
	broken := env(map[string]string{"DB_MAX_CONNS": "0"})
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"}, {"serve", "--help"}, {"migrate", "--help"}, {"keys", "create", "--help"},
		{"keys", "list", "-h"}, {"keys", "revoke", "--help"}, {"sweep", "--help"}, {"reconcile", "--help"},
		{"processor-sim", "--help"}, {"healthcheck", "--help"},
	} {
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), args, broken, &out), "%v", args)
		require.Contains(t, out.String(), "api keys create --principal NAME", "%v", args)
		for _, s := range config.Settings() {
			require.Contains(t, out.String(), "  "+s.Name+"="+s.Default+"\n", "%v", args)
		}
	}
}

// scriptRunner returns a function that runs scripts/name with a verb (up,
// down), env added to the environment, for at most two minutes, failing t
// when it fails; it returns the script's trimmed output.
func scriptRunner(t *testing.T, name string, env ...string) func(args ...string) string {
	t.Helper()
	script, err := filepath.Abs("../../scripts/" + name)
	require.NoError(t, err)
	return func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, script, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
		return strings.TrimSpace(string(out))
	}
}
