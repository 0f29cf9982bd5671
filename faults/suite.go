package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/faultproxy"
)

// config is every knob of a run.
type config struct {
	adminURL       string        // a superuser on a migrated database the suite may fill
	phase          time.Duration // how long each fault lasts
	workers        int           // concurrent clients
	intentDeadline time.Duration // a client gives up on an intent after this
	idleInTx       time.Duration // the API's DB_IDLE_IN_TX_TIMEOUT
	out            string        // api.log goes here
	wide           bool          // the report's phases as one wide table
	// cluster, when set, is a pg_auto_failover formation that adminURL
	// reaches through a multi-host URL: the API connects to it directly,
	// and the phases are failovers (failoverPhases) instead of the proxy's
	// faults.
	cluster *cluster
	// citus, when set, is a Citus cluster whose coordinator adminURL
	// names: the API connects to it directly, and the phases are its nodes
	// lost (citusPhases).
	citus *citusCluster
}

// direct reports whether the API connects to the database itself, with no
// fault proxy between: the faults are servers lost, not connections.
func (cfg config) direct() bool { return cfg.cluster != nil || cfg.citus != nil }

// settleBound is how long the outbox gets to settle what the clients
// created after a phase. On Citus, a job that was running when the
// coordinator died cannot record its end; it runs again once older than
// OUTBOX_RESCUE_AFTER (10 s), at River's rescuer's next look (every 30 s).
func (cfg config) settleBound() time.Duration {
	if cfg.citus != nil {
		return 2 * time.Minute
	}
	return 30 * time.Second
}

// Results is what a run saw.
type Results struct {
	Phases     []*phaseStats `json:"phases"`
	Invariants []check       `json:"invariants"`
	Payments   int           `json:"payments"`
	Refunds    int           `json:"refunds"`
	Unknown    int           `json:"outcome_unknown_answers"`
	// UnknownIntents met at least one unknown outcome; of those, by what
	// the same key found on retry: committed (a replay) or not (executed).
	UnknownIntents      int           `json:"outcome_unknown_intents"`
	UnknownCommitted    int           `json:"unknown_then_replayed"`
	UnknownNotCommitted int           `json:"unknown_then_executed"`
	Duration            time.Duration `json:"duration_ns"`
	// LostCharged counts the acknowledged payments missing from the
	// database that the processor had charged (see verify).
	LostCharged int `json:"lost_payments_charged"`
	// IDKeyedTwice counts the intents that a processor key per payment id
	// (the design before migration 18) would have charged more than once
	// in this same run: their key reached the processor under two ids.
	IDKeyedTwice int `json:"intents_charged_twice_if_keyed_by_payment_id"`
}

// Held reports whether every invariant held.
func (r *Results) Held() bool {
	for _, c := range r.Invariants {
		if !c.Holds {
			return false
		}
	}
	return true
}

// check is one invariant and what was found.
type check struct {
	Name  string `json:"name"`
	Found int    `json:"found"`
	Holds bool   `json:"holds"`
}

// phase is one fault, active for the phase's duration.
type phase struct {
	name string
	// inject runs for the phase's duration and returns how many faults it
	// injected that are not counted as they happen.
	inject func(ctx context.Context, d time.Duration) (int, error)
}

// run builds and starts the API behind a fault proxy, drives retrying
// clients through every fault in turn, then checks the database against what
// the clients were told.
func run(ctx context.Context, cfg config, progress io.Writer) (*Results, error) {
	began := time.Now()
	adminCfg, err := pgxpool.ParseConfig(cfg.adminURL)
	if err != nil {
		return nil, fmt.Errorf("parse -database-url: %w", err)
	}
	adminCfg.MaxConns = 2
	admin, err := pgxpool.NewWithConfig(ctx, adminCfg)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	secrets, err := tenants(ctx, admin, cfg.citus)
	if err != nil {
		return nil, err
	}

	// Behind the fault proxy, unless the faults are servers lost: then the
	// API connects as a service would, to the formation's multi-host URL or
	// to the Citus coordinator.
	var proxy *faultproxy.Proxy
	appURL := database.WithUser(cfg.adminURL, "payments_app")
	if !cfg.direct() {
		proxy, err = faultproxy.Start(fmt.Sprintf("%s:%d", adminCfg.ConnConfig.Host, adminCfg.ConnConfig.Port))
		if err != nil {
			return nil, err
		}
		defer proxy.Close()
		if appURL, err = proxy.Via(appURL); err != nil {
			return nil, err
		}
	}

	dir, err := os.MkdirTemp("", "faults-api")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(progress, "building cmd/api")
	bin, err := buildAPI(ctx, dir, progress)
	if err != nil {
		return nil, err
	}
	// The processor runs here, so its counts can be read: how often money
	// moved for each payment and refund. It misbehaves too: 10% of calls
	// fail (nothing charged), 5% are charged and then dropped unanswered.
	sim := simulator.New(simulator.Config{ErrorRate: 0.1, DropRate: 0.05, Seed: 1})
	simLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	simSrv := &http.Server{Handler: sim, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = simSrv.Serve(simLn) }()
	defer simSrv.Close()

	env := []string{
		"PROCESSOR_URL=http://" + simLn.Addr().String(),
		"PROCESSOR_TIMEOUT=2s",
		"OUTBOX_WORKERS=4",
		"OUTBOX_JOB_TIMEOUT=5s",
		"OUTBOX_RESCUE_AFTER=10s",
		"OUTBOX_RETRY_BASE=50ms",
		"OUTBOX_RETRY_MAX=500ms",
		"OUTBOX_MAX_ATTEMPTS=25",
		"METRICS_ADDR=127.0.0.1:0",
		"DATABASE_URL=" + appURL,
		"MAINTENANCE_DATABASE_URL=" + database.WithUser(cfg.adminURL, "payments_maintenance"),
		"MIGRATE_ON_START=false",
		"DB_MAX_CONNS=6",
		"OUTBOX_DB_MAX_CONNS=2",
		"DB_ACQUIRE_TIMEOUT=1s",
		"LOCK_TIMEOUT=300ms",
		"REQUEST_TIMEOUT=1s",
		"SHUTDOWN_TIMEOUT=2s",
		"DB_IDLE_IN_TX_TIMEOUT=" + cfg.idleInTx.String(),
		// A COMMIT into a half-open connection is answered outcome-unknown
		// well before the vanished holder's idle bound, as the default's 3 s
		// is before the default's 10 s, so that retries meet the held key.
		"DB_COMMIT_TIMEOUT=500ms",
		"LOG_LEVEL=warn",
	}
	if cfg.direct() {
		// An outbox that keeps up with the clients, so that a payment is
		// charged within moments of its 201, as in production (the proxy's
		// faults want a small one that they can back up). The failover
		// lesson counts payments lost after they were charged; on Citus,
		// 4 workers fell behind in the phase without a fault (charge lag
		// up to 9 s), and every tenant's refunds waited for their charges.
		env = append(env, "OUTBOX_WORKERS=32", "OUTBOX_DB_MAX_CONNS=6")
	}
	if cfg.citus != nil {
		env = append(env,
			// A request is a coordinator's plan and a worker's execution,
			// each a server on the same cores: give them the time they take
			// under load here (a p99 of 400 ms, docs/scaling.md).
			"REQUEST_TIMEOUT=3s", "DB_COMMIT_TIMEOUT=1500ms", "LOCK_TIMEOUT=1s", "DB_ACQUIRE_TIMEOUT=2s",
			// A charge that met a dead node is tried again for longer than
			// its crash recovery takes (20 s and more on this machine): 25
			// attempts of at most 500 ms ran out before it was back.
			"OUTBOX_RETRY_BASE=200ms", "OUTBOX_RETRY_MAX=2s", "OUTBOX_MAX_ATTEMPTS=60")
	}
	api, err := newAPI(bin, filepath.Join(cfg.out, "api.log"), env)
	if err != nil {
		return nil, err
	}
	defer api.stop()
	if err := api.start(ctx); err != nil {
		return nil, err
	}

	c := &client{
		http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.workers}},
		base: api.URL,
	}
	var l *ledger
	names, phases := proxyPhases(proxy, api, &l)
	switch {
	case cfg.cluster != nil:
		names, phases = failoverPhases(cfg.cluster, cfg.adminURL, c, &l)
	case cfg.citus != nil:
		names, phases = citusPhases(cfg.citus, &l)
	}
	l = newLedger(names)
	res := &Results{}
	for i, p := range phases {
		fmt.Fprintf(progress, "phase %d/%d: %s (%s)\n", i+1, len(phases), p.name, cfg.phase)
		l.setPhase(i)
		givenUp := 0
		if proxy != nil {
			givenUp = proxy.CommitsGivenUp()
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range cfg.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				work(ctx, c, l, stop, cfg.intentDeadline, uint64(i*cfg.workers+w)+1, false, secrets[w%len(secrets)])
			}()
		}
		if cfg.direct() {
			// Every other client may be waiting on a refund whose payment's
			// charge is held up; this one times the payments.
			wg.Go(func() { work(ctx, c, l, stop, cfg.intentDeadline, uint64(1_000_000+i), true, secrets[i%len(secrets)]) })
		}
		probe := &primaryProbe{}
		var probed sync.WaitGroup
		if cfg.cluster != nil {
			probed.Go(func() { probe.run(ctx, cfg.adminURL, stop) })
		}
		n, err := p.inject(ctx, cfg.phase)
		l.addFaults(n)
		// The fault is over: every client finishes its intent, abandoned
		// sessions get the idle-in-transaction bound and a margin to end,
		// and then the database is checked against what clients were told.
		close(stop)
		l.closePhase()
		wg.Wait()
		probed.Wait()
		if err != nil {
			return nil, fmt.Errorf("phase %q: %w", p.name, err)
		}
		if cfg.cluster != nil {
			l.phases[i].NoPrimary = probe.Longest()
		}
		if cfg.direct() {
			// The suite's own connections may be to the old primary, or to
			// the coordinator that was killed.
			admin.Reset()
		}
		// The bound on a vanished holder is on its transaction: none may
		// stay open, idle, past DB_IDLE_IN_TX_TIMEOUT (and a margin for the
		// server's timer). A half-open connection that was idle in the pool,
		// with no transaction, holds no lock and is not a stuck key, so the
		// proxy's count of held connections is not the measure.
		stuckAfter := cfg.idleInTx + 5*time.Second
		bound := time.Now().Add(stuckAfter)
		for time.Now().Before(bound) {
			n, err := idleInTransaction(ctx, admin, 0)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		// The outbox settles what the clients created: a job whose worker
		// was killed runs again after OUTBOX_RESCUE_AFTER.
		if err := waitSettled(ctx, admin, cfg.settleBound()); err != nil {
			return nil, err
		}
		if proxy != nil {
			// Read late: the service closes a connection whose COMMIT it gave
			// up on just after it answered, and settling takes longer.
			l.phases[i].CommitsGivenUp = proxy.CommitsGivenUp() - givenUp
		}
		held, err := idleInTransaction(ctx, admin, stuckAfter)
		if err != nil {
			return nil, err
		}
		if i == len(phases)-1 {
			// Last, every acknowledged request is sent once more with its
			// key, as a client whose answer was lost would: each must
			// replay what was acknowledged, whatever the phases did to the
			// database. Its new executions, if any, are then settled.
			fmt.Fprintln(progress, "retrying every acknowledged request with its key")
			resend(ctx, c, l, cfg.intentDeadline)
			if err := waitSettled(ctx, admin, cfg.settleBound()); err != nil {
				return nil, err
			}
		}
		checks, err := verify(ctx, admin, l, held, sim)
		if err != nil {
			return nil, err
		}
		for _, c := range checks {
			if !c.Holds {
				l.phases[i].Broken = append(l.phases[i].Broken, c.Name)
			}
		}
		res.Invariants = checks
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	res.Phases, res.Unknown = l.phases, l.unknown
	res.UnknownIntents, res.UnknownCommitted, res.UnknownNotCommitted = l.unknownIntents, l.UnknownCommitted, l.UnknownNotCommitted
	res.Payments, res.Refunds = len(l.payments), len(l.refunds)
	res.Duration = time.Since(began)
	res.LostCharged, res.IDKeyedTwice = l.lostCharged, l.idKeyedTwice
	return res, nil
}

// proxyPhases are the suite's faults at the fault proxy and at the API's
// process, in the order they run. l is the ledger the phases count their
// faults in, set once the names are known.
func proxyPhases(proxy *faultproxy.Proxy, api *apiProcess, l **ledger) ([]string, []phase) {
	// Every COMMIT-time fault hits one COMMIT in every n.
	commitFault := func(action faultproxy.Action, every int) func(context.Context, time.Duration) (int, error) {
		return func(ctx context.Context, d time.Duration) (int, error) {
			n := 0
			proxy.OnCommit(func() faultproxy.Action {
				n++
				if n%every != 0 {
					return faultproxy.Forward
				}
				(*l).addFaults(1)
				return action
			})
			defer proxy.OnCommit(nil)
			return 0, sleep(ctx, d)
		}
	}
	names := []string{"no fault", "cut before COMMIT", "cut after COMMIT", "swallowed COMMIT reply",
		"half-open holder", "database refuses connections", "kill -9 of the API, restart"}
	phases := []phase{
		{names[0], func(ctx context.Context, d time.Duration) (int, error) { return 0, sleep(ctx, d) }},
		{names[1], commitFault(faultproxy.CutBefore, 4)},
		{names[2], commitFault(faultproxy.CutAfter, 4)},
		{names[3], commitFault(faultproxy.SwallowReply, 8)},
		{names[4], func(ctx context.Context, d time.Duration) (int, error) {
			// Two holders vanish at the start; the rest of the phase shows
			// how long their keys stay locked.
			n := 0
			proxy.OnCommit(func() faultproxy.Action {
				n++
				if n > 2 {
					return faultproxy.Forward
				}
				(*l).addFaults(1)
				return faultproxy.HalfOpen
			})
			defer proxy.OnCommit(nil)
			return 0, sleep(ctx, d)
		}},
		{names[5], func(ctx context.Context, d time.Duration) (int, error) {
			before := proxy.Refused()
			proxy.Refuse(true)
			proxy.CutAll()
			err := sleep(ctx, d/2)
			proxy.Refuse(false)
			if err != nil {
				return 0, err
			}
			return 1 + proxy.Refused() - before, sleep(ctx, d-d/2)
		}},
		{names[6], func(ctx context.Context, d time.Duration) (int, error) {
			if err := sleep(ctx, d/3); err != nil {
				return 0, err
			}
			api.kill9()
			if err := sleep(ctx, 300*time.Millisecond); err != nil {
				return 1, err
			}
			if err := api.start(ctx); err != nil {
				return 1, fmt.Errorf("restart after kill -9: %w", err)
			}
			return 1, sleep(ctx, d-d/3)
		}},
	}
	return names, phases
}

// idleInTransaction counts the sessions of the suite's database that have
// sat in an open transaction, without running a statement, for longer than
// idle: those whose holder vanished and that the server has not ended. On
// Citus it sees the coordinator's sessions only, not the workers'.
func idleInTransaction(ctx context.Context, admin *pgxpool.Pool, idle time.Duration) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'
		  AND state_change <= now() - make_interval(secs => $1)`, idle.Seconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count idle transactions: %w", err)
	}
	return n, nil
}

// waitSettled waits until no payment is processing and no refund pending,
// or the bound passes; verify reports what is left.
func waitSettled(ctx context.Context, admin *pgxpool.Pool, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		var n int
		err := admin.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM payments WHERE status = 'processing') + (SELECT count(*) FROM refunds WHERE status = 'pending')`).Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 || time.Now().After(deadline) {
			return nil
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
