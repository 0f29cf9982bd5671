package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/httpapi"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
	"github.com/payments-reference/idempotent-payments/internal/reconcile"
)

// badText is what a processor might answer: longer than any column, with
// bytes that are not UTF-8 and a NUL among them.
var badText = strings.Repeat("é", 80) + "\xff\xfe\x00" + strings.Repeat("x", 100)

// A processor's over-long, non-UTF-8, NUL-containing reasons and ids are
// recorded as the columns can hold them: every payment settles (a refund:
// TestRefundProcessorsOddAnswersStillSettle).
// (Copied as they came, a 121-character decline broke the column's check,
// the job was discarded, and the payment stayed processing for ever.)
func TestProcessorsOddAnswersStillSettle(t *testing.T) {
	t.Parallel()
	var declineCharges atomic.Bool
	b := setup(t, func(o *options) {
		o.processor = func(sim http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				charge := r.URL.Path == "/v1/charges"
				switch {
				case r.Method == http.MethodPost && charge && declineCharges.Load():
					w.WriteHeader(http.StatusPaymentRequired)
					_ = json.NewEncoder(w).Encode(map[string]string{"error": badText})
				case r.Method == http.MethodPost && charge:
					w.WriteHeader(http.StatusOK)
					_ = json.NewEncoder(w).Encode(map[string]string{"id": badText})
				default:
					sim.ServeHTTP(w, r)
				}
			})
		}
	})
	k := b.newKey(t, "acme", allScopes...)
	charged := b.createPayment(t, k.Secret, 1000) // succeeded, with an odd processor id
	var processorID string
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT processor_id FROM payments WHERE id = $1`, charged).Scan(&processorID))
	requireStorable(t, processorID)

	declineCharges.Store(true)
	r := b.post(t, "/v1/payments", k.Secret, "declined", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	p := b.settled(t, "/v1/payments/"+decode(t, r.Body)["id"].(string), k.Secret)
	require.Equal(t, "failed", p["status"])
	requireStorable(t, p["failure_reason"].(string))
	require.True(t, strings.HasPrefix(p["failure_reason"].(string), "éé"), "the reason is kept, cut: %q", p["failure_reason"])
}

func requireStorable(t *testing.T, s string) {
	t.Helper()
	require.True(t, utf8.ValidString(s), "%q", s)
	require.NotContains(t, s, "\x00")
	require.LessOrEqual(t, utf8.RuneCountInString(s), payments.MaxProcessorTextLength)
}

// A row the reconciler cannot settle is logged at ERROR, counted, and passed
// over: the rows behind it are settled. (The first error ended each run, and
// the rows are taken oldest first, so one bad row stopped reconciliation for
// every tenant for ever.)
func TestReconcilerGoesOnPastARowItCannotSettle(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxAttempts = 1 })
	b.sim.SetConfig(simulator.Config{DropRate: 1}) // charged, every reply lost
	k := b.newKey(t, "acme", allScopes...)
	var ids []string
	for i := range 2 {
		r := b.post(t, "/v1/payments", k.Secret, "undecided-"+itoa(i), paymentBody)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		id := decode(t, r.Body)["id"].(string)
		require.Equal(t, "requires_reconciliation", b.settled(t, "/v1/payments/"+id, k.Secret)["status"])
		ids = append(ids, id)
	}
	// The older row cannot be settled: a trigger refuses it.
	_, err := b.admin.Exec(context.Background(), `
		CREATE FUNCTION refuse_settle() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'this row cannot be settled'; END $$;
		CREATE TRIGGER refuse_settle BEFORE UPDATE ON payments FOR EACH ROW
			WHEN (OLD.id = '`+ids[0]+`') EXECUTE FUNCTION refuse_settle();`)
	require.NoError(t, err)
	b.sim.SetConfig(simulator.Config{})

	res, err := b.reconciler.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Examined: 1, Succeeded: 1, Errors: 1}, res)
	require.Equal(t, "requires_reconciliation", decode(t, b.get(t, "/v1/payments/"+ids[0], k.Secret).Body)["status"])
	require.Equal(t, "succeeded", decode(t, b.get(t, "/v1/payments/"+ids[1], k.Secret).Body)["status"], "the row behind the bad one")
	require.Contains(t, b.logs.String(), `"level":"ERROR","msg":"reconcile: could not settle a row`)
	require.Contains(t, b.logs.String(), ids[0])
	require.EqualValues(t, 1, b.counter(t, "reconciliation_errors"))
}

// A burst over a principal's rate limit gets 429 rate-limited with
// Retry-After and the RateLimit headers, and nothing is stored for those
// requests; a burst of unknown keys from one address is limited by the
// address before any of them costs the database a look-up.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	const perPrincipal, perClient = 5, 3
	b := setup(t, func(o *options) {
		o.rateLimits = httpapi.RateLimits{PerPrincipal: perPrincipal, PerClient: perClient}
	})
	k := b.newKey(t, "acme", allScopes...)
	// The key's first request is counted as its address's: the key is not
	// known to the process until it authenticated once.
	first := b.get(t, "/v1/payments", k.Secret)
	require.Equal(t, http.StatusOK, first.Status)
	require.Equal(t, `"client";q=3;w=1`, first.Header.Get("RateLimit-Policy"))

	// Each burst is sent at once, so that it falls in one or two windows
	// however slow the machine; the answers are checked afterwards.
	burst := func(n int, send func(i int) response) []response {
		out := make([]response, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { out[i] = send(i) })
		}
		wg.Wait()
		return out
	}
	created, limited := 0, 0
	for i, r := range burst(20, func(i int) response {
		return b.post(t, "/v1/payments", k.Secret, "burst-"+itoa(i), paymentBody)
	}) {
		switch r.Status {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			limited++
			requireProblem(t, r, http.StatusTooManyRequests, "rate-limited")
			require.Equal(t, "1", r.Header.Get("Retry-After"))
			require.Equal(t, `"principal";q=5;w=1`, r.Header.Get("RateLimit-Policy"))
			require.Contains(t, r.Header.Get("RateLimit"), `"principal";r=0;t=1`)
		default:
			t.Fatalf("burst %d: %d %s", i, r.Status, r.Body)
		}
	}
	// A sliding window: what the previous second admitted counts too, so
	// at most a limit's worth more may pass at a window's edge.
	require.Positive(t, created)
	require.LessOrEqual(t, created, 2*perPrincipal)
	require.Equal(t, 20, created+limited)
	require.Equal(t, created, b.count(t, `SELECT count(*) FROM payments`), "nothing stored for a limited request")
	require.Equal(t, created, b.count(t, `SELECT count(*) FROM idempotency_keys`), "no key consumed by a limited request")

	// Unknown keys, each well-formed: limited by the address.
	unknown := 0
	for _, r := range burst(10, func(int) response {
		return b.get(t, "/v1/payments", "sk_test_"+randomSuffix()+randomSuffix())
	}) {
		if r.Status == http.StatusTooManyRequests {
			unknown++
			requireProblem(t, r, http.StatusTooManyRequests, "rate-limited")
		} else {
			require.Equal(t, http.StatusUnauthorized, r.Status)
		}
	}
	require.GreaterOrEqual(t, unknown, 10-2*perClient)
}

// A transaction left open in another database of the server (which can
// never write these tables) does not hold new payments out of the lists:
// their horizon counts this database's transactions only (list_horizon,
// migration 17). With the server-wide horizon it did, for as long as the
// stray transaction stayed open.
func TestAStrayTransactionElsewhereDoesNotStallTheLists(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	stillOpen := strayTransactionElsewhere(t, b)

	pay := b.createPayment(t, k.Secret, 1000)
	page := b.listed(t, "/v1/payments", k.Secret, 1)
	require.Equal(t, pay, page["data"].([]any)[0].(map[string]any)["id"])
	require.True(t, stillOpen(), "the stray transaction was open all along")
}

// strayTransactionElsewhere opens a transaction with an xid in another
// database of b's server, left open until the test ends, and returns what
// tells whether it still is.
func strayTransactionElsewhere(t *testing.T, b *testBundle) (stillOpen func() bool) {
	t.Helper()
	elsewhere, err := url.Parse(b.db.AdminURL)
	require.NoError(t, err)
	elsewhere.Path = "/postgres"
	ctx := context.Background()
	stray, err := pgx.Connect(ctx, elsewhere.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = stray.Close(context.Background()) })
	tx, err := stray.Begin(ctx)
	require.NoError(t, err)
	var xid string
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid))
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return func() bool {
		var open bool
		require.NoError(t, b.admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE backend_xid::text = $1)`, xid).Scan(&open))
		return open
	}
}
