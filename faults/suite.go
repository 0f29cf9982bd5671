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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/internal/auth"
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
	var key auth.NewKey
	err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) (err error) {
		key, err = auth.CreateKey(ctx, tx, "faults", []string{auth.ScopePaymentsWrite, auth.ScopeRefundsWrite})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create api key: %w", err)
	}

	// Behind the fault proxy, unless the faults are failovers: then the API
	// connects as a service would, with the formation's multi-host URL.
	var proxy *faultproxy.Proxy
	appURL := database.WithUser(cfg.adminURL, "payments_app")
	if cfg.cluster == nil {
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
	if cfg.cluster != nil {
		// An outbox that keeps up with the clients, so that a payment is
		// charged within moments of its 201, as in production (the proxy's
		// faults want a small one that they can back up). The failover
		// lesson counts payments lost after they were charged.
		env = append(env, "OUTBOX_WORKERS=32", "OUTBOX_DB_MAX_CONNS=6")
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
		http:   &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.workers}},
		base:   api.URL,
		secret: key.Secret,
	}
	var l *ledger
	names, phases := proxyPhases(proxy, api, &l)
	if cfg.cluster != nil {
		names, phases = failoverPhases(cfg.cluster, cfg.adminURL, c, &l)
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
				work(ctx, c, l, stop, cfg.intentDeadline, uint64(i*cfg.workers+w)+1, false)
			}()
		}
		if cfg.cluster != nil {
			// Every other client may be waiting on a refund whose payment's
			// charge is held up; this one times the payments.
			wg.Go(func() { work(ctx, c, l, stop, cfg.intentDeadline, uint64(1_000_000+i), true) })
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
		wg.Wait()
		l.closePhase()
		probed.Wait()
		if err != nil {
			return nil, fmt.Errorf("phase %q: %w", p.name, err)
		}
		if cfg.cluster != nil {
			l.phases[i].NoPrimary = probe.Longest()
			// The suite's own connections may be to the old primary.
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
		if err := waitSettled(ctx, admin, 30*time.Second); err != nil {
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
			if err := waitSettled(ctx, admin, 30*time.Second); err != nil {
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

// verify checks the invariants against the database, once the clients have
// stopped.
func verify(ctx context.Context, admin *pgxpool.Pool, l *ledger, held int, sim *simulator.Simulator) ([]check, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dbPayments := map[string]bool{}
	perIntent := map[string]int{}
	intentOfDB := map[string]string{}
	rows, err := admin.Query(ctx, `SELECT id::text, coalesce(metadata->>'intent', '') FROM payments`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, in string
		if err := rows.Scan(&id, &in); err != nil {
			return nil, err
		}
		dbPayments[id] = true
		perIntent[in]++
		intentOfDB[id] = in
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	dbRefunds, err := queryStrings(ctx, admin, `SELECT id::text FROM refunds`)
	if err != nil {
		return nil, err
	}
	producers, err := queryStrings(ctx, admin, `SELECT correlation_id FROM idempotency_keys`)
	if err != nil {
		return nil, err
	}
	var inProgress, overRefunded int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE state = 'in_progress'`).Scan(&inProgress); err != nil {
		return nil, err
	}
	if err := admin.QueryRow(ctx, `
		SELECT count(*) FROM payments p
		WHERE p.amount_refunded > p.amount
		   OR p.amount_refunded <> (SELECT coalesce(sum(r.amount), 0) FROM refunds r WHERE r.payment_id = p.id AND r.status <> 'failed')`).Scan(&overRefunded); err != nil {
		return nil, err
	}
	unsettled, chargedTwice, chargeMismatch, err := processorChecks(ctx, admin, sim)
	if err != nil {
		return nil, err
	}
	// A job that ended (discarded after its last attempt, cancelled) while
	// its payment or refund is still undecided and not labelled for
	// reconciliation: the money's fate would be nobody's job.
	var orphaned int
	if err := admin.QueryRow(ctx, `
		SELECT count(*) FROM river_job j
		WHERE j.state IN ('discarded', 'cancelled')
		  AND ((j.kind = 'charge_payment' AND EXISTS (
		          SELECT 1 FROM payments p WHERE p.id = (j.args->>'payment_id')::uuid AND p.status = 'processing'))
		    OR (j.kind = 'refund_payment' AND EXISTS (
		          SELECT 1 FROM refunds r WHERE r.id = (j.args->>'refund_id')::uuid AND r.status = 'pending')))`).Scan(&orphaned); err != nil {
		return nil, err
	}
	// An undecided payment or refund has a job: in River's table, not
	// finished, or in outbox_jobs, waiting for the relay.
	var jobless int
	if err := admin.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM payments p WHERE p.status = 'processing' AND NOT EXISTS (
		            SELECT 1 FROM river_job j WHERE j.kind = 'charge_payment' AND j.args @> jsonb_build_object('payment_id', p.id)
		              AND j.finalized_at IS NULL) AND NOT EXISTS (
		            SELECT 1 FROM outbox_jobs o WHERE o.kind = 'charge_payment' AND o.args @> jsonb_build_object('payment_id', p.id)))
		     + (SELECT count(*) FROM refunds r WHERE r.status = 'pending' AND NOT EXISTS (
		            SELECT 1 FROM river_job j WHERE j.kind = 'refund_payment' AND j.args @> jsonb_build_object('refund_id', r.id)
		              AND j.finalized_at IS NULL) AND NOT EXISTS (
		            SELECT 1 FROM outbox_jobs o WHERE o.kind = 'refund_payment' AND o.args @> jsonb_build_object('refund_id', r.id)))`).Scan(&jobless); err != nil {
		return nil, err
	}

	missingEvents, strayEvents, err := eventChecks(ctx, admin)
	if err != nil {
		return nil, err
	}

	// Charges per payment intent, across every payment it ever had: those
	// the clients were told of and those in the database. One intent
	// charged under two payment ids is a customer charged twice.
	idsOf := map[string]map[string]bool{}
	addID := func(in, id string) {
		if idsOf[in] == nil {
			idsOf[in] = map[string]bool{}
		}
		idsOf[in][id] = true
	}
	for id, in := range l.intentOf {
		addID(in, id)
	}
	for id, in := range intentOfDB {
		addID(in, id)
	}
	// Money moved per processor key the intent's payments were charged
	// with: one key for every payment of an intent (the key is the client's
	// intent, migration 18), so a retry of a lost payment is answered with
	// the first charge; a key per payment would show here as two.
	// The same run, counted for the design before migration 18 (a key per
	// payment id): an intent whose charged key reached the processor under
	// two payment ids would have been charged once per id.
	refs := sim.ReferencesPerKey()
	chargedIntents := 0
	l.idKeyedTwice = 0
	for _, ids := range idsOf {
		n, perID := 0, 0
		seen := map[string]bool{}
		for id := range ids {
			if k := sim.KeyFor(id); k != "" && !seen[k] {
				seen[k] = true
				n += sim.Effects(k)
				if sim.Effects(k) > 0 {
					perID += refs[k]
				}
			}
		}
		if n > 1 {
			chargedIntents++
		}
		if perID > 1 {
			l.idKeyedTwice++
		}
	}

	duplicated := 0
	for _, n := range perIntent {
		if n > 1 {
			duplicated++
		}
	}
	lostPayments, strayPayments := diff(keys(l.payments), dbPayments)
	// Of the acknowledged payments the database lost, how many the
	// processor had charged: each is a customer charged for a payment the
	// service no longer knows, and charged again when the client retried.
	l.lostCharged = 0
	for id := range l.payments {
		if !dbPayments[id] && sim.EffectsFor(id) > 0 {
			l.lostCharged++
		}
	}
	lostRefunds, strayRefunds := diff(keys(l.refunds), set(dbRefunds))
	mislabelled := 0
	for _, id := range producers {
		if l.noEffect[id] {
			mislabelled++
		}
	}
	checks := []check{
		{Name: "intents with more than one payment", Found: duplicated},
		{Name: "acknowledged payments missing from the database", Found: lostPayments},
		{Name: "payments no client was told about", Found: strayPayments},
		{Name: "acknowledged refunds missing from the database", Found: lostRefunds},
		{Name: "refunds no client was told about", Found: strayRefunds},
		{Name: "payments refunded beyond their amount, or out of step with their refunds", Found: overRefunded},
		{Name: "payments and refunds left processing or pending", Found: unsettled},
		{Name: "processing or pending without a live job (nor requires_reconciliation)", Found: jobless},
		{Name: "jobs discarded or cancelled with their payment or refund undecided", Found: orphaned},
		{Name: "payments and refunds the processor executed more than once", Found: chargedTwice},
		{Name: "succeeded ones the processor never executed, or failed ones it did", Found: chargeMismatch},
		{Name: "payment intents the processor charged more than once, under any id", Found: chargedIntents},
		{Name: "acknowledged requests that, retried with their key, were not replayed", Found: l.reexecuted},
		{Name: "decided payments and refunds without the event of their status", Found: missingEvents},
		{Name: "events for a change that did not commit, or recorded twice", Found: strayEvents},
		{Name: "keys left in_progress", Found: inProgress},
		{Name: "intents without a final answer within the deadline", Found: l.unresolved},
		{Name: "transactions left open past the idle-in-transaction bound", Found: held},
		{Name: "500 answers", Found: l.serverErrors},
		{Name: "attempts told \"no effect\" that produced the stored outcome", Found: mislabelled},
	}
	for i := range checks {
		checks[i].Holds = checks[i].Found == 0
	}
	return checks, nil
}

// eventChecks counts the decided payments and refunds that have no event of
// their current status (an event lost for a committed change), and the
// events that no committed change explains: of a status the object never
// had (a requires_reconciliation one may have been settled since), or the
// same change recorded twice.
func eventChecks(ctx context.Context, admin *pgxpool.Pool) (missing, stray int, err error) {
	err = admin.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM payments p WHERE p.status <> 'processing' AND NOT EXISTS (
		            SELECT 1 FROM events e WHERE e.type = 'payment.' || p.status AND e.data->'object'->>'id' = p.id::text))
		     + (SELECT count(*) FROM refunds r WHERE r.status <> 'pending' AND NOT EXISTS (
		            SELECT 1 FROM events e WHERE e.type = 'refund.' || r.status AND e.data->'object'->>'id' = r.id::text))`).Scan(&missing)
	if err != nil {
		return 0, 0, fmt.Errorf("events of decided rows: %w", err)
	}
	err = admin.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM events e LEFT JOIN payments p ON p.id::text = e.data->'object'->>'id'
		        WHERE e.type LIKE 'payment.%' AND (p.id IS NULL
		           OR e.type <> 'payment.' || p.status AND NOT (e.type = 'payment.requires_reconciliation' AND p.status IN ('succeeded', 'failed'))))
		     + (SELECT count(*) FROM events e LEFT JOIN refunds r ON r.id::text = e.data->'object'->>'id'
		        WHERE e.type LIKE 'refund.%' AND (r.id IS NULL
		           OR e.type <> 'refund.' || r.status AND NOT (e.type = 'refund.requires_reconciliation' AND r.status IN ('succeeded', 'failed'))))
		     + (SELECT count(*) FROM (SELECT 1 FROM events GROUP BY type, data->'object'->>'id' HAVING count(*) > 1) twice)`).Scan(&stray)
	if err != nil {
		return 0, 0, fmt.Errorf("events without their change: %w", err)
	}
	return missing, stray, nil
}

// idleInTransaction counts the sessions of the suite's database that have
// sat in an open transaction, without running a statement, for longer than
// idle: those whose holder vanished and that the server has not ended.
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

// processorChecks compares the database with the processor: how many are
// not settled, how many keys the processor executed twice, and how many
// settled ones disagree with it (succeeded without its effect, failed with it).
func processorChecks(ctx context.Context, admin *pgxpool.Pool, sim *simulator.Simulator) (unsettled, twice, mismatch int, err error) {
	rows, err := admin.Query(ctx, `SELECT id::text, status FROM payments UNION ALL SELECT id::text, status FROM refunds`)
	if err != nil {
		return 0, 0, 0, err
	}
	type row struct{ id, status string }
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.status)
	})
	if err != nil {
		return 0, 0, 0, err
	}
	for _, x := range all {
		n := sim.EffectsFor(x.id)
		switch {
		case x.status == "processing" || x.status == "pending":
			unsettled++
		case x.status == "requires_reconciliation":
			// Undecided on purpose, and labelled so: the processor's
			// answer was never seen. Whatever the simulator did is
			// consistent with it; the reconciler settles it later.
		case n > 1:
			twice++
		case (x.status == "succeeded") != (n == 1):
			mismatch++
		}
	}
	return unsettled, twice, mismatch, nil
}

func queryStrings(ctx context.Context, db *pgxpool.Pool, sql string) ([]string, error) {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func keys[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func set(xs []string) map[string]bool {
	out := make(map[string]bool, len(xs))
	for _, x := range xs {
		out[x] = true
	}
	return out
}

// diff counts what told has that stored lacks, and the other way round.
func diff(told, stored map[string]bool) (lost, stray int) {
	for id := range told {
		if !stored[id] {
			lost++
		}
	}
	for id := range stored {
		if !told[id] {
			stray++
		}
	}
	return lost, stray
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
