package httpapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/reconcile"
)

// An outcome the processor never gave is never guessed. Every attempt of a
// charge ends without an answer: on the last one the payment is recorded
// requires_reconciliation, not failed. The reconciler then settles it from the
// processor's ledger: succeeded when the processor charged (its replies were
// lost), failed when it never processed the key (it was down).
func TestAnUnknownOutcomeWaitsForReconciliation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		fault      simulator.Config
		status     string
		reason     any
		effects    int
		processor  bool // a processor id is recorded
		lookupDown bool // the first reconciliation finds the processor down
	}{
		{name: "charged, every reply lost", fault: simulator.Config{DropRate: 1},
			status: "succeeded", reason: nil, effects: 1, processor: true},
		{name: "never processed, the processor down", fault: simulator.Config{ErrorRate: 1},
			status: "failed", reason: "not_processed", effects: 0, lookupDown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(o *options) { o.maxAttempts = 2 })
			b.sim.SetConfig(tc.fault)
			k := b.newKey(t, "acme", allScopes...)
			r := b.post(t, "/v1/payments", k.Secret, "unknown", paymentBody)
			require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
			id := decode(t, r.Body)["id"].(string)

			got := b.settled(t, "/v1/payments/"+id, k.Secret)
			require.Equal(t, "requires_reconciliation", got["status"], "an unknown outcome on the last attempt is not a failure")
			require.Nil(t, got["failure_reason"])
			require.Equal(t, tc.effects, b.sim.EffectsFor(id))
			require.EqualValues(t, 1, b.gauge(t, "reconciliation_waiting"))
			require.Positive(t, b.gauge(t, "reconciliation_oldest_waiting_age_seconds"))

			if tc.lookupDown {
				res, err := b.reconciler.Run(context.Background())
				require.NoError(t, err)
				require.Equal(t, reconcile.Result{Examined: 1, Waiting: 1}, res, "a processor that cannot answer leaves it waiting")
				require.Equal(t, "requires_reconciliation", decode(t, b.get(t, "/v1/payments/"+id, k.Secret).Body)["status"])
			}
			b.sim.SetConfig(simulator.Config{})
			res, err := b.reconciler.Run(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, res.Examined)
			got = decode(t, b.get(t, "/v1/payments/"+id, k.Secret).Body)
			require.Equal(t, tc.status, got["status"])
			require.Equal(t, tc.reason, got["failure_reason"])
			require.Equal(t, tc.effects, b.sim.EffectsFor(id), "reconciling never charges")
			var processorID *string
			require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT processor_id FROM payments WHERE id = $1`, id).Scan(&processorID))
			require.Equal(t, tc.processor, processorID != nil)

			require.Zero(t, b.gauge(t, "reconciliation_waiting"))
			require.Zero(t, b.gauge(t, "reconciliation_oldest_waiting_age_seconds"))

			again, err := b.reconciler.Run(context.Background())
			require.NoError(t, err)
			require.Zero(t, again.Examined, "a settled payment is not looked at again")
		})
	}
}

// The transaction that records the last attempt's answer can itself fail
// (here: the service role may not write the status). River then discards the
// job, and the payment would wait for ever. The reconciler finds it by the
// job that ended without deciding it, and settles it.
func TestAPaymentWhoseJobEndedUndecidedIsReconciled(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxAttempts = 2 })
	k := b.newKey(t, "acme", allScopes...)
	ctx := context.Background()
	_, err := b.admin.Exec(ctx, `REVOKE UPDATE (status) ON payments FROM payments_app`)
	require.NoError(t, err)

	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	id := decode(t, r.Body)["id"].(string)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'charge_payment' AND state = 'discarded'`) == 1
	}, settleWithin, 20*time.Millisecond, "the job was never discarded")
	require.Equal(t, "processing", decode(t, b.get(t, "/v1/payments/"+id, k.Secret).Body)["status"])
	require.Equal(t, 1, b.sim.EffectsFor(id), "the processor charged; the answer was never recorded")

	_, err = b.admin.Exec(ctx, `GRANT UPDATE (status) ON payments TO payments_app`)
	require.NoError(t, err)
	res, err := b.reconciler.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Examined: 1, Succeeded: 1}, res)
	require.Equal(t, "succeeded", decode(t, b.get(t, "/v1/payments/"+id, k.Secret).Body)["status"])
}

// A payment whose job was deleted (by an operator, or a role that could) is
// found as well; the processor never saw it, so it failed.
func TestAPaymentWhoseJobWasDeletedIsReconciled(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	k := b.newKey(t, "acme", allScopes...)
	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	id := decode(t, r.Body)["id"].(string)

	res, err := b.reconciler.Run(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Examined, "a payment whose job is waiting to run is the job's, not the reconciler's")

	b.deleteJobs(t, `kind = 'charge_payment'`)
	res, err = b.reconciler.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Examined: 1, Failed: 1}, res)
	got := decode(t, b.get(t, "/v1/payments/"+id, k.Secret).Body)
	require.Equal(t, "failed", got["status"])
	require.Equal(t, "not_processed", got["failure_reason"])
}

// A processor may charge a request it received long after the caller gave
// up, and after its lookup said "no record": tried by hand, a charge the
// processor made 8 s after it was sent reached a customer whose payment had
// been recorded failed, not_processed, at 6.2 s. The reconciler cancels the
// key at the processor before it records "no record" as final: the late
// charge then moves nothing, and the payment's failure is the truth.
func TestALateChargeMovesNothingOnceNotProcessedIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) {
		o.maxAttempts = 1
		o.processorTimeout = 200 * time.Millisecond
	})
	// The processor holds the charge far longer than the job and the
	// reconciler take, even on a loaded machine.
	b.sim.SetConfig(simulator.Config{CommitDelay: 5 * time.Second})
	k := b.newKey(t, "acme", allScopes...)
	r := b.post(t, "/v1/payments", k.Secret, "late", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	id := decode(t, r.Body)["id"].(string)
	require.Equal(t, "requires_reconciliation", b.settled(t, "/v1/payments/"+id, k.Secret)["status"])
	require.Equal(t, 1, b.sim.Waiting(), "the processor holds the charge it received")

	res, err := b.reconciler.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Examined: 1, Failed: 1}, res)
	got := decode(t, b.get(t, "/v1/payments/"+id, k.Secret).Body)
	require.Equal(t, "failed", got["status"])
	require.Equal(t, "not_processed", got["failure_reason"])

	require.Eventually(t, func() bool { return b.sim.Waiting() == 0 }, 20*time.Second, 20*time.Millisecond)
	require.Zero(t, b.sim.EffectsFor(id), "the charge the processor made late moved money for a payment recorded failed")
	res, err = b.reconciler.Run(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Examined)
}

// Rows whose job is still live are the jobs', not the reconciler's: a run
// reads past a page of them to the rows whose job has ended (during a
// processor outage most undecided rows are still their jobs').
func TestTheReconcilerReadsPastRowsWhoseJobIsLive(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	k := b.newKey(t, "acme", allScopes...)
	var ids []string
	for _, key := range []string{"older", "newer"} {
		r := b.post(t, "/v1/payments", k.Secret, key, paymentBody)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		ids = append(ids, decode(t, r.Body)["id"].(string))
	}
	b.deleteJobs(t, `args->>'payment_id' = $1`, ids[1])
	onePerPage := *b.reconciler
	onePerPage.Batch = 1
	res, err := onePerPage.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Examined: 1, Failed: 1}, res)
	require.Equal(t, "processing", decode(t, b.get(t, "/v1/payments/"+ids[0], k.Secret).Body)["status"], "its job is waiting")
	require.Equal(t, "failed", decode(t, b.get(t, "/v1/payments/"+ids[1], k.Secret).Body)["status"])
}

// A payment whose commit is lost after its charge went out (a lossy
// failover takes the payment, its key and its job) is made again by the
// client's retry, under a new id, and the processor is asked with the same
// key: the client's intent, not the payment's id. It answers with the
// first charge; the customer is charged once. With the payment's id as the
// key, the retry was a second charge.
func TestARetryOfALostPaymentIsNotChargedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	first := b.post(t, "/v1/payments", k.Secret, "lost-order", paymentBody)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	lost := decode(t, first.Body)["id"].(string)
	require.Equal(t, "succeeded", b.settled(t, "/v1/payments/"+lost, k.Secret)["status"])
	require.Equal(t, 1, b.sim.EffectsFor(lost))

	// The failover: everything the payment's commit wrote is gone.
	for _, sql := range []string{
		`DELETE FROM events WHERE data->'object'->>'id' = $1`,
		`DELETE FROM payments WHERE id = $1::uuid`,
		`DELETE FROM idempotency_keys WHERE key = 'lost-order' AND $1 <> ''`,
	} {
		_, err := b.admin.Exec(context.Background(), sql, lost)
		require.NoError(t, err)
	}
	b.deleteJobs(t, `args->>'payment_id' = $1`, lost)

	retry := b.post(t, "/v1/payments", k.Secret, "lost-order", paymentBody)
	require.Equal(t, http.StatusCreated, retry.Status, "%s", retry.Body)
	again := decode(t, retry.Body)["id"].(string)
	require.NotEqual(t, lost, again, "the retry executed again: the first payment is gone")
	require.Equal(t, "succeeded", b.settled(t, "/v1/payments/"+again, k.Secret)["status"])
	require.Equal(t, b.sim.KeyFor(lost), b.sim.KeyFor(again), "one intent, one processor key")
	require.Equal(t, 1, b.sim.EffectsFor(again), "the processor answered with the first charge")

	// Another intent under another key is another charge.
	other := b.post(t, "/v1/payments", k.Secret, "another-order", paymentBody)
	require.Equal(t, http.StatusCreated, other.Status, "%s", other.Body)
	otherID := decode(t, other.Body)["id"].(string)
	require.Equal(t, "succeeded", b.settled(t, "/v1/payments/"+otherID, k.Secret)["status"])
	require.NotEqual(t, b.sim.KeyFor(lost), b.sim.KeyFor(otherID))
	require.Equal(t, 1, b.sim.EffectsFor(otherID))
}

// recordedLookups keeps what the reconciler asked the processor.
type recordedLookups struct {
	processor.Processor
	records []processor.Record
}

func (r *recordedLookups) Lookup(ctx context.Context, rec processor.Record) (processor.Result, error) {
	r.records = append(r.records, rec)
	return r.Processor.Lookup(ctx, rec)
}
