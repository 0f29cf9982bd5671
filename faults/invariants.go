package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
)

// snapshot is the database as the invariants see it: each table read
// whole, by a statement of its own, and compared here. The comparisons are
// joins, and a Citus cluster refuses most of them in SQL (River's
// river_job is a table of the coordinator's, joined with distributed
// tenant tables; events meet payments on a JSON field, not on the
// distribution column), so the checks are written once, in Go, for one
// server and for a cluster.
type snapshot struct {
	payments map[string]paymentRow
	refunds  map[string]refundRow
	events   []eventRow
	// jobs are River's charge and refund jobs; waiting are the object ids
	// whose job still waits in outbox_jobs for the relay.
	jobs    []jobRow
	waiting map[string]bool
	keys    []keyRow
}

type paymentRow struct {
	status           string
	amount, refunded int64
	intent           string // metadata.intent: the client's intent key
}

type refundRow struct {
	paymentID, status string
	amount            int64
}

type eventRow struct{ typ, objectID string }

// jobRow is a River job of a charge or a refund: its kind, state, the
// payment's or refund's id, and whether it has not finished.
type jobRow struct {
	kind, state, objectID string
	live                  bool
}

type keyRow struct{ state, producer string }

// read takes the snapshot. The clients have stopped and the outbox has
// settled what it could, so the reads need not be one transaction.
func read(ctx context.Context, db *pgxpool.Pool) (*snapshot, error) {
	s := &snapshot{payments: map[string]paymentRow{}, refunds: map[string]refundRow{}, waiting: map[string]bool{}}
	err := each(ctx, db, `SELECT id::text, status, amount, amount_refunded, coalesce(metadata->>'intent', '') FROM payments`,
		func(r pgx.Rows) error {
			var id string
			var p paymentRow
			err := r.Scan(&id, &p.status, &p.amount, &p.refunded, &p.intent)
			s.payments[id] = p
			return err
		})
	if err == nil {
		err = each(ctx, db, `SELECT id::text, payment_id::text, status, amount FROM refunds`, func(r pgx.Rows) error {
			var id string
			var x refundRow
			err := r.Scan(&id, &x.paymentID, &x.status, &x.amount)
			s.refunds[id] = x
			return err
		})
	}
	if err == nil {
		err = each(ctx, db, `SELECT type, coalesce(data->'object'->>'id', '') FROM events`, func(r pgx.Rows) error {
			var e eventRow
			err := r.Scan(&e.typ, &e.objectID)
			s.events = append(s.events, e)
			return err
		})
	}
	if err == nil {
		err = each(ctx, db, `
			SELECT kind, state::text, coalesce(args->>'payment_id', args->>'refund_id', ''), finalized_at IS NULL
			FROM river_job WHERE kind IN ('charge_payment', 'refund_payment')`, func(r pgx.Rows) error {
			var j jobRow
			err := r.Scan(&j.kind, &j.state, &j.objectID, &j.live)
			s.jobs = append(s.jobs, j)
			return err
		})
	}
	if err == nil {
		err = each(ctx, db, `
			SELECT coalesce(args->>'payment_id', args->>'refund_id', '')
			FROM outbox_jobs WHERE kind IN ('charge_payment', 'refund_payment')`, func(r pgx.Rows) error {
			var id string
			err := r.Scan(&id)
			s.waiting[id] = true
			return err
		})
	}
	if err == nil {
		err = each(ctx, db, `SELECT state, correlation_id FROM idempotency_keys`, func(r pgx.Rows) error {
			var k keyRow
			err := r.Scan(&k.state, &k.producer)
			s.keys = append(s.keys, k)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("read the database for the invariants: %w", err)
	}
	return s, nil
}

// each runs sql and calls scan for every row.
func each(ctx context.Context, db *pgxpool.Pool, sql string, scan func(pgx.Rows) error) error {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// verify checks the invariants against the database, once the clients have
// stopped.
func verify(ctx context.Context, admin *pgxpool.Pool, l *ledger, held int, sim *simulator.Simulator) ([]check, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := read(ctx, admin)
	if err != nil {
		return nil, err
	}
	dbPayments := map[string]bool{}
	perIntent := map[string]int{}
	for id, p := range s.payments {
		dbPayments[id] = true
		perIntent[p.intent]++
	}
	dbRefunds := map[string]bool{}
	for id := range s.refunds {
		dbRefunds[id] = true
	}
	inProgress := 0
	for _, k := range s.keys {
		if k.state == "in_progress" {
			inProgress++
		}
	}
	unsettled, chargedTwice, chargeMismatch := processorChecks(s, sim)
	missingEvents, strayEvents := eventChecks(s)

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
	for id, p := range s.payments {
		addID(p.intent, id)
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
	lostRefunds, strayRefunds := diff(keys(l.refunds), dbRefunds)
	mislabelled := 0
	for _, k := range s.keys {
		if l.noEffect[k.producer] {
			mislabelled++
		}
	}
	checks := []check{
		{Name: "intents with more than one payment", Found: duplicated},
		{Name: "acknowledged payments missing from the database", Found: lostPayments},
		{Name: "payments no client was told about", Found: strayPayments},
		{Name: "acknowledged refunds missing from the database", Found: lostRefunds},
		{Name: "refunds no client was told about", Found: strayRefunds},
		{Name: "payments refunded beyond their amount, or out of step with their refunds", Found: overRefunded(s)},
		{Name: "payments and refunds left processing or pending", Found: unsettled},
		{Name: "processing or pending without a live job (nor requires_reconciliation)", Found: jobless(s)},
		{Name: "jobs discarded or cancelled with their payment or refund undecided", Found: orphaned(s)},
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

// undecided reports whether the payment or refund id waits for the
// processor's answer: a payment processing, a refund pending.
func (s *snapshot) undecided(id string) bool {
	if p, ok := s.payments[id]; ok {
		return p.status == "processing"
	}
	r, ok := s.refunds[id]
	return ok && r.status == "pending"
}

// overRefunded counts the payments refunded beyond their amount, or whose
// amount_refunded is not the sum of their refunds that did not fail.
func overRefunded(s *snapshot) int {
	sum := map[string]int64{}
	for _, r := range s.refunds {
		if r.status != "failed" {
			sum[r.paymentID] += r.amount
		}
	}
	n := 0
	for id, p := range s.payments {
		if p.refunded > p.amount || p.refunded != sum[id] {
			n++
		}
	}
	return n
}

// jobless counts the undecided payments and refunds with no job: none in
// River's table that has not finished, and none waiting in outbox_jobs.
// Nobody would ever decide them.
func jobless(s *snapshot) int {
	live := map[string]bool{}
	for _, j := range s.jobs {
		if j.live {
			live[j.objectID] = true
		}
	}
	n := 0
	for id := range s.payments {
		if s.undecided(id) && !live[id] && !s.waiting[id] {
			n++
		}
	}
	for id := range s.refunds {
		if s.undecided(id) && !live[id] && !s.waiting[id] {
			n++
		}
	}
	return n
}

// orphaned counts the jobs that ended (discarded after their last attempt,
// cancelled) while their payment or refund is still undecided and not
// labelled for reconciliation: the money's fate would be nobody's job.
func orphaned(s *snapshot) int {
	n := 0
	for _, j := range s.jobs {
		if (j.state == "discarded" || j.state == "cancelled") && s.undecided(j.objectID) {
			n++
		}
	}
	return n
}

// eventChecks counts the decided payments and refunds that have no event of
// their current status (an event lost for a committed change), and the
// events that no committed change explains: of a status the object never
// had (a requires_reconciliation one may have been settled since), or the
// same change recorded twice.
func eventChecks(s *snapshot) (missing, stray int) {
	type change struct{ typ, id string }
	seen := map[change]int{}
	for _, e := range s.events {
		seen[change{e.typ, e.objectID}]++
	}
	for c, n := range seen {
		if n > 1 {
			stray++
		}
		now := "" // the event type of the object's status now; empty: no such object
		switch {
		case strings.HasPrefix(c.typ, "payment."):
			if p, ok := s.payments[c.id]; ok {
				now = "payment." + p.status
			}
		case strings.HasPrefix(c.typ, "refund."):
			if r, ok := s.refunds[c.id]; ok {
				now = "refund." + r.status
			}
		default:
			continue
		}
		if now == "" {
			stray += n
			continue
		}
		settledSince := strings.HasSuffix(c.typ, ".requires_reconciliation") &&
			(strings.HasSuffix(now, ".succeeded") || strings.HasSuffix(now, ".failed"))
		if c.typ != now && !settledSince {
			stray += n
		}
	}
	for id, p := range s.payments {
		if p.status != "processing" && seen[change{"payment." + p.status, id}] == 0 {
			missing++
		}
	}
	for id, r := range s.refunds {
		if r.status != "pending" && seen[change{"refund." + r.status, id}] == 0 {
			missing++
		}
	}
	return missing, stray
}

// processorChecks compares the database with the processor: how many are
// not settled, how many keys the processor executed twice, and how many
// settled ones disagree with it (succeeded without its effect, failed with it).
func processorChecks(s *snapshot, sim *simulator.Simulator) (unsettled, twice, mismatch int) {
	statuses := map[string]string{}
	for id, p := range s.payments {
		statuses[id] = p.status
	}
	for id, r := range s.refunds {
		statuses[id] = r.status
	}
	for id, status := range statuses {
		n := sim.EffectsFor(id)
		switch {
		case status == "processing" || status == "pending":
			unsettled++
		case status == "requires_reconciliation":
			// Undecided on purpose, and labelled so: the processor's
			// answer was never seen. Whatever the simulator did is
			// consistent with it; the reconciler settles it later.
		case n > 1:
			twice++
		case (status == "succeeded") != (n == 1):
			mismatch++
		}
	}
	return unsettled, twice, mismatch
}

func keys[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
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
