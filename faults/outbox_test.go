package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// rig is the service binary with its outbox workers, calling a processor
// simulator that the test can read and reconfigure.
type rig struct {
	t     *testing.T
	admin *pgxpool.Pool
	sim   *simulator.Simulator
	api   *apiProcess
	c     *client
	// secret is the API key the payments are made with.
	secret string
}

// newRig starts the API with a simulator configured by sim; the outbox's
// timeouts are short so that a killed worker's job is rescued in seconds.
// env overrides the API's settings.
func newRig(t *testing.T, sim simulator.Config, env ...string) *rig {
	t.Helper()
	// The API's pool (6), its outbox's (2) and maintenance pool (2), the
	// test's own (2), spare.
	db := testdb.New(t, 14)
	ctx := context.Background()
	ac, err := pgxpool.ParseConfig(db.AdminURL)
	require.NoError(t, err)
	ac.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, ac)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	var key auth.NewKey
	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) (err error) {
		key, err = auth.CreateKey(ctx, tx, "outbox", []string{auth.ScopePaymentsWrite, auth.ScopePaymentsRead})
		return err
	}))

	r := &rig{t: t, admin: admin, sim: simulator.New(sim), secret: key.Secret}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: r.sim, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	dir := t.TempDir()
	bin, err := buildAPI(ctx, dir, testWriter{t})
	require.NoError(t, err)
	r.api, err = newAPI(bin, filepath.Join(dir, "api.log"), append([]string{
		"PROCESSOR_URL=http://" + ln.Addr().String(),
		"PROCESSOR_TIMEOUT=4s",
		"OUTBOX_WORKERS=4",
		"OUTBOX_JOB_TIMEOUT=5s",
		"OUTBOX_RESCUE_AFTER=6s",
		"OUTBOX_RETRY_BASE=50ms",
		"OUTBOX_RETRY_MAX=500ms",
		"OUTBOX_MAX_ATTEMPTS=25",
		"METRICS_ADDR=127.0.0.1:0",
		"DATABASE_URL=" + database.WithUser(db.AdminURL, "payments_app"),
		"MAINTENANCE_DATABASE_URL=" + database.WithUser(db.AdminURL, "payments_maintenance"),
		"MIGRATE_ON_START=false",
		"DB_MAX_CONNS=6",
		"OUTBOX_DB_MAX_CONNS=2",
		"LOG_LEVEL=warn",
	}, env...))
	require.NoError(t, err)
	t.Cleanup(r.api.stop)
	require.NoError(t, r.api.start(ctx))
	r.c = &client{http: &http.Client{Timeout: 10 * time.Second}, base: r.api.URL}
	return r
}

// pay creates n payments, workers at a time, each retried with its key
// until it is acknowledged, and returns their ids.
func (r *rig) pay(n, workers int) []string {
	r.t.Helper()
	var mu sync.Mutex
	var ids, refused []string
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				in := intent{key: uuid.NewString(), secret: r.secret, amount: int64(1000 + i*100)} // never ends in 02: none declined
				for {
					rep := r.c.send(context.Background(), in)
					if rep.status == http.StatusCreated {
						mu.Lock()
						ids = append(ids, rep.id)
						mu.Unlock()
						break
					}
					if rep.final() {
						mu.Lock()
						refused = append(refused, fmt.Sprintf("payment %d: %s", i, rep.label()))
						mu.Unlock()
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	require.Empty(r.t, refused)
	return ids
}

// rescued is the bound for jobs a killed process left running: River's
// rescuer (leader only, once the killed leader's lease has run out) looks
// at start and then every 30 s, and a job is rescued once it has run for
// OUTBOX_RESCUE_AFTER (6 s here). A restart within those 6 s waits for the
// rescuer's next look, about 30 s later, so 30 s was the bound's own size and
// failed on a busy machine (2026-12-06).
const rescued = 60 * time.Second

// requireChargedOnce waits for every payment to settle and checks each was
// charged by the processor exactly once and recorded as succeeded.
func (r *rig) requireChargedOnce(ids []string, bound time.Duration) {
	r.t.Helper()
	ctx := context.Background()
	require.NoError(r.t, waitSettled(ctx, r.admin, bound))
	s, err := read(ctx, r.admin)
	require.NoError(r.t, err)
	unsettled, twice, mismatch := processorChecks(s, r.sim)
	require.Zero(r.t, unsettled, "payments still processing after %s", bound)
	require.Zero(r.t, twice, "payments charged more than once")
	require.Zero(r.t, mismatch, "payments whose status disagrees with the processor")
	for _, id := range ids {
		require.Equal(r.t, 1, r.sim.EffectsFor(id), "payment %s", id)
	}
	var succeeded int
	require.NoError(r.t, r.admin.QueryRow(ctx, `SELECT count(*) FROM payments WHERE status = 'succeeded'`).Scan(&succeeded))
	require.Equal(r.t, len(ids), succeeded)
}

// Killed after the payments committed, while their charges were on the way
// to the processor but not yet processed: nothing was charged, and after a
// restart every payment is charged exactly once.
func TestCrashBetweenCommitAndCharge(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: runs and kills the service binary; the full test command (and CI) runs it")
	}
	t.Parallel()
	r := newRig(t, simulator.Config{Latency: 3 * time.Second})
	ids := r.pay(8, 4)
	require.Eventually(t, func() bool { return r.sim.Waiting() >= 4 }, 10*time.Second, 10*time.Millisecond,
		"the workers never called the processor")
	r.api.kill9()
	for _, id := range ids {
		require.Zero(t, r.sim.EffectsFor(id), "charged before the crash: the test did not crash in between")
	}
	r.sim.SetConfig(simulator.Config{})
	require.NoError(t, r.api.start(context.Background()))
	r.requireChargedOnce(ids, rescued)
}

// Killed after the processor charged but before the answers were recorded:
// after a restart the rescued jobs call again with the same keys, the
// processor replays its answers without charging, and every payment is
// recorded as succeeded, charged exactly once.
func TestCrashBetweenChargeAndRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: runs and kills the service binary; the full test command (and CI) runs it")
	}
	t.Parallel()
	r := newRig(t, simulator.Config{TimeoutRate: 1, Hold: 3 * time.Second})
	ids := r.pay(8, 4)
	require.Eventually(t, func() bool { return r.sim.Holding() >= 4 }, 10*time.Second, 10*time.Millisecond,
		"the processor never charged")
	r.api.kill9()
	var charged int
	for _, id := range ids {
		charged += r.sim.EffectsFor(id)
	}
	require.Positive(t, charged, "nothing was charged before the crash: the test did not crash in between")
	var recorded int
	require.NoError(t, r.admin.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE status <> 'processing'`).Scan(&recorded))
	require.Less(t, recorded, charged, "every charge was recorded before the crash: the test did not crash in between")
	r.sim.SetConfig(simulator.Config{})
	require.NoError(t, r.api.start(context.Background()))
	r.requireChargedOnce(ids, rescued)
}

// Killed during a job's last attempt, after the processor charged and before
// the answer was recorded: River's rescuer finds the job running with no
// attempt left and discards it, so no worker will ever decide the payment.
// The reconciler finds each payment processing without a live job and settles
// it from the processor's ledger: succeeded, charged exactly once.
func TestCrashDuringTheLastAttempt(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: runs and kills the service binary; the full test command (and CI) runs it")
	}
	t.Parallel()
	r := newRig(t, simulator.Config{TimeoutRate: 1, Hold: 3 * time.Second},
		"OUTBOX_MAX_ATTEMPTS=1", "RECONCILE_INTERVAL=1s", "RECONCILE_GRACE=5s")
	ids := r.pay(4, 4)
	require.Eventually(t, func() bool { return r.sim.Holding() >= 4 }, 10*time.Second, 10*time.Millisecond,
		"the processor never charged")
	r.api.kill9()
	r.sim.SetConfig(simulator.Config{})
	require.NoError(t, r.api.start(context.Background()))
	// Rescue after 6 s, then the reconciler's 5 s grace and 1 s period.
	r.requireChargedOnce(ids, 60*time.Second)
	var discarded int
	require.NoError(t, r.admin.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job WHERE kind = 'charge_payment' AND state = 'discarded'`).Scan(&discarded))
	require.Equal(t, len(ids), discarded, "the jobs ended without deciding: the reconciler, not a worker, settled the payments")
}

// A soak through a processor that fails 20% of calls and drops the reply of
// 5% of the charges it makes: every payment ends succeeded, charged exactly
// once, none left processing.
func TestOutboxSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: a soak of the outbox; the full test command (and CI) runs it")
	}
	t.Parallel()
	r := newRig(t, simulator.Config{ErrorRate: 0.2, DropRate: 0.05, Seed: 7})
	start := time.Now()
	ids := r.pay(1000, 8)
	created := time.Since(start)
	r.requireChargedOnce(ids, 60*time.Second)
	st := r.sim.Stats()
	t.Logf("1000 payments created in %s, all charged once and recorded %s after the first; the processor saw %d calls",
		created.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), st.Calls)
}

// testWriter sends build output to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
