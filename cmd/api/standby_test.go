package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A payment whose COMMIT gave up waiting for the synchronous standby is
// committed on the primary only: a failover loses it. Its key must not be
// replayed as a 201 meanwhile, or the client holds an acknowledgement the
// standby never saw (issue #35). The PostgreSQL here waits for a standby
// that never comes (synchronous_standby_names names none that exists): the
// first attempt's client gives up, its COMMIT is given up after
// DB_COMMIT_TIMEOUT, and the retry with the same key gets 503
// outcome-unknown until the standby has everything (here: until the wait is
// switched off), then the replay.
func TestAReplayWaitsForTheStandby(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("its own PostgreSQL is started with runuser, as root; CI runs as root")
	}
	if testing.Short() {
		t.Skip("-short skips it: an initdb, about 5 s")
	}
	t.Parallel()
	do := scriptRunner(t, "limited-postgres", "LIMITED_DIR="+filepath.Join(os.TempDir(), "standby-test-"+strconv.Itoa(os.Getpid())),
		"LIMITED_PORT=26348", "MEMORY=512MB", "LIMITED_CONF=synchronous_standby_names = 'ghost'",
		"PGOPTIONS=-c synchronous_commit=local") // the script's own CREATE DATABASE
	t.Cleanup(func() { do("down") })
	do("up")
	// The owner's and the maintenance role's sessions commit without
	// waiting (synchronous_commit=local): only the service's requests meet
	// the missing standby.
	url := func(role string) string { return "postgres://" + role + "@127.0.0.1:26348/payments?sslmode=disable" }
	local := "&synchronous_commit=local"
	addr := freeAddr(t)
	getenv := env(map[string]string{
		"ADDR": addr, "METRICS_ADDR": "off", "OUTBOX_WORKERS": "0", "WEBHOOK_WORKERS": "0", "MIGRATE_ON_START": "false",
		"DB_COMMIT_TIMEOUT":        "500ms",
		"DATABASE_URL":             url("payments_app"),
		"MIGRATE_DATABASE_URL":     url("postgres") + local,
		"MAINTENANCE_DATABASE_URL": url("payments_maintenance") + local,
	})
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, run(ctx, []string{"migrate", "up"}, getenv, io.Discard))
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:write"}, getenv, &out))
	var key struct{ Secret string }
	require.NoError(t, json.Unmarshal(out.Bytes(), &key))
	done := make(chan error, 1)
	go func() { done <- runLogging(ctx, nil, getenv, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitOK(t, "http://"+addr+"/healthz")

	payUntil := func(reqCtx context.Context) (int, string, string) {
		req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(`{"amount": 1000, "currency": "usd"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		req.Header.Set("Idempotency-Key", "order-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", ""
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body)
	}
	pay := func(timeout time.Duration) (int, string, string) {
		reqCtx, stop := context.WithTimeout(ctx, timeout)
		defer stop()
		return payUntil(reqCtx)
	}

	admin, err := pgx.Connect(ctx, url("postgres")+local)
	require.NoError(t, err)
	defer admin.Close(context.Background())
	// The client gives up once the request's COMMIT waits for the standby
	// (a fixed 200 ms timeout was, on a loaded machine, sometimes before
	// the request reached its COMMIT, which then never happened).
	reqCtx, giveUp := context.WithCancel(ctx)
	first := make(chan int, 1)
	go func() {
		status, _, _ := payUntil(reqCtx)
		first <- status
	}()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&waiting))
		return waiting == 1
	}, 10*time.Second, 20*time.Millisecond, "the request's COMMIT never waited for the standby")
	giveUp()
	require.Zero(t, <-first, "the client gave up while the COMMIT waited for the standby")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n))
		return n == 1
	}, 10*time.Second, 50*time.Millisecond, "the given-up COMMIT is committed on the primary")

	status, replayed, body := pay(10 * time.Second)
	require.Equal(t, http.StatusServiceUnavailable, status, "a payment the standby may not have is not acknowledged: %s %s", replayed, body)
	require.Contains(t, body, "outcome-unknown")

	// The standby has caught up (here: the wait is off): the same key replays.
	_, err = admin.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = ''`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		status, replayed, _ = pay(10 * time.Second)
		return status == http.StatusCreated
	}, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, "true", replayed)
}
