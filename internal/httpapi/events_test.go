package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/events"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// An event exists if and only if its status change committed: a change
// rolled back leaves neither event nor delivery, and a change made twice
// (a rescued job, the reconciler after the worker) is recorded once.
func TestEventsCommitWithTheirChange(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	principal, id := paymentToSettle(t, b)
	announcer := events.Announcer{Fanout: webhooks.Fanout{Schedule: testSchedule}}
	settle := func(commit bool) bool { return settleDirectly(t, b, principal, id, announcer, commit) }
	deliveries := func() int { return b.jobs(t, `kind = 'deliver_webhook'`) }

	require.True(t, settle(false))
	require.Zero(t, b.count(t, `SELECT count(*) FROM events`), "a rolled-back change has no event")
	require.Zero(t, deliveries())

	require.True(t, settle(true))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, 1, deliveries(), "one delivery per endpoint")

	require.False(t, settle(true), "already decided")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM events`), "a repeated change is recorded once")
	require.Equal(t, 1, deliveries())
}

// A service without events (docs/fork.md) settles with a nil announcer:
// the payment is decided, and no event is written nor delivery queued.
func TestASettleWithoutAnAnnouncerWritesNoEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	principal, id := paymentToSettle(t, b)

	require.True(t, settleDirectly(t, b, principal, id, nil, true))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments WHERE status = 'succeeded'`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM events`))
	require.Zero(t, b.jobs(t, `kind = 'deliver_webhook'`))
	require.False(t, settleDirectly(t, b, principal, id, nil, true), "already decided")
}

// paymentToSettle makes a payment, left processing (b has no workers), for
// a principal with a webhook endpoint, and returns the principal and the
// payment's id.
func paymentToSettle(t *testing.T, b *testBundle) (principal, id uuid.UUID) {
	t.Helper()
	k := b.newKey(t, "acme", allScopes...)
	b.registerEndpoint(t, k.Secret, "http://127.0.0.1:9/hook")
	r := b.post(t, "/v1/payments", k.Secret, "pay", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status)
	id = uuid.MustParse(decode(t, r.Body)["id"].(string))
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT principal_id FROM payments WHERE id = $1`, id).Scan(&principal))
	return principal, id
}

// settleDirectly settles principal's payment id as succeeded, as its charge
// job would, with announcer, and commits or rolls back; it returns whether
// the settle changed the row.
func settleDirectly(t *testing.T, b *testBundle, principal, id uuid.UUID, announcer payments.Announcer, commit bool) bool {
	t.Helper()
	var changed bool
	errRollback := errors.New("roll back")
	err := database.InTenantTx(context.Background(), b.pool, principal, database.TxOptions{}, func(tx pgx.Tx) error {
		p, err := payments.Get(context.Background(), tx, principal, id)
		if err != nil {
			return err
		}
		settle, settled, err := payments.Settle(context.Background(), announcer, payments.SettleParams{Principal: principal, Payment: p, Status: payments.StatusSucceeded, ProcessorID: "ch_1"})
		if err == nil {
			err = database.Send(context.Background(), tx, settle...)
		}
		if err == nil {
			changed = *settled
		}
		if err == nil && !commit {
			return errRollback
		}
		return err
	})
	if !commit {
		require.ErrorIs(t, err, errRollback)
	} else {
		require.NoError(t, err)
	}
	return changed
}

// Events older than 30 days are swept, with their delivery attempts; the
// maintenance role cannot delete a younger one.
func TestEventsAreSweptAfterThirtyDays(t *testing.T) {
	t.Parallel()
	b, k, _, endpointID := webhookSetup(t)
	b.createPayment(t, k.Secret, 1000)
	b.createPayment(t, k.Secret, 2000)
	b.attemptsOf(t, k.Secret, endpointID, 2)
	ctx := context.Background()
	_, err := b.admin.Exec(ctx, `UPDATE events SET created_at = now() - interval '31 days' WHERE id = (SELECT id FROM events ORDER BY id LIMIT 1)`)
	require.NoError(t, err)

	maint, err := database.Open(ctx, b.db.MaintenanceURL, database.PoolConfig{MaxConns: 1, AcquireTimeout: 15 * time.Second})
	require.NoError(t, err)
	defer maint.Close()
	tag, err := maint.Pgx().Exec(ctx, `DELETE FROM events WHERE created_at > now() - interval '30 days'`)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "row-level security refuses a young event to the maintenance role")

	n, err := events.Sweep(ctx, maint, 1, time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM webhook_deliveries`), "the swept event's attempts went with it")
	require.Len(t, b.listed(t, "/v1/events", k.Secret, 1)["data"], 1)
}

// A client that follows GET /v1/events?starting_after= sees every event
// exactly once while events are being committed, as for payments
// (TestListCursorNeverSkipsConcurrentPayments): thousands of payments
// settled by the outbox's workers, one poller.
func TestEventCursorNeverSkipsConcurrentEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: 20 s of concurrent writers and pollers; the full test command (and CI) runs it")
	}
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 8 })
	k := b.newKey(t, "poller", allScopes...)
	client := b.srv.Client()
	send := func(method, path, key, body string) (int, []byte, error) {
		req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+k.Secret)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		return resp.StatusCode, raw, err
	}
	const creators, each = 16, 125
	errs := make(chan error, creators)
	var creating sync.WaitGroup
	for c := range creators {
		creating.Go(func() {
			for i := range each {
				status, raw, err := send(http.MethodPost, "/v1/payments", fmt.Sprintf("c%d-%d", c, i), paymentBody)
				if err == nil && status != http.StatusCreated {
					err = fmt.Errorf("create: %d %s", status, raw)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { creating.Wait(); close(done) }()

	seen := map[string]int{}
	cursor := ""
	lastNew := time.Now()
	for {
		select {
		case <-done:
			if len(seen) >= creators*each || time.Since(lastNew) > 30*time.Second {
				goto polled
			}
		default:
		}
		path := "/v1/events?limit=100"
		if cursor != "" {
			path += "&starting_after=" + cursor
		}
		status, raw, err := send(http.MethodGet, path, "", "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%s", raw)
		var page struct{ Data []struct{ ID string } }
		require.NoError(t, json.Unmarshal(raw, &page))
		for _, e := range page.Data {
			seen[e.ID]++
			cursor = e.ID
			lastNew = time.Now()
		}
		if len(page.Data) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
polled:
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	rows, err := b.admin.Query(context.Background(), `SELECT id::text FROM events`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, creators*each, "one event per payment")
	skipped, twice := 0, 0
	for _, id := range ids {
		switch seen[id] {
		case 0:
			skipped++
		case 1:
		default:
			twice++
		}
	}
	require.Zero(t, twice, "events seen more than once")
	require.Zero(t, skipped, "of %d events, %d were never seen by the poller", len(ids), skipped)
}

// A transaction left open in another database of the server does not hold
// new events out of their list, as it does not hold payments out of theirs
// (TestAStrayTransactionElsewhereDoesNotStallTheLists).
func TestAStrayTransactionElsewhereDoesNotStallTheEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	stillOpen := strayTransactionElsewhere(t, b)

	b.createPayment(t, k.Secret, 1000)
	b.listed(t, "/v1/events", k.Secret, 1)
	require.True(t, stillOpen(), "the stray transaction was open all along")
}
