package httpapi_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// patchEndpoint changes an endpoint under a fresh key.
func (b *testBundle) patchEndpoint(t *testing.T, secret, id, body string) response {
	t.Helper()
	return b.do(t, call{method: http.MethodPatch, path: "/v1/webhook_endpoints/" + id, secret: secret, key: "patch-" + randomSuffix(), body: body})
}

// eventTypes returns the types of the events a receiver got, in order.
func eventTypes(t *testing.T, got []delivery) []string {
	var types []string
	for _, d := range got {
		types = append(types, decode(t, d.body)["type"].(string))
	}
	return types
}

// An endpoint is sent only the event types it takes; a bad list is refused
// before anything is stored, and the filter can be changed.
func TestWebhookEnabledEventsFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	rc := b.receiver(t)
	for _, bad := range []string{`[]`, `["*", "payment.failed"]`, `["payment.refunded"]`, `["payment.failed", "payment.failed"]`, `"*"`} {
		r := b.post(t, "/v1/webhook_endpoints", k.Secret, "bad-filter", `{"url": "`+rc.srv.URL+`", "enabled_events": `+bad+`}`)
		requireProblem(t, r, http.StatusBadRequest, "validation-failed")
	}
	r := b.post(t, "/v1/webhook_endpoints", k.Secret, "bad-filter", `{"url": "`+rc.srv.URL+`", "enabled_events": ["payment.failed"]}`)
	require.Equal(t, http.StatusCreated, r.Status, "the refused requests consumed no key: %s", r.Body)
	ep := decode(t, r.Body)
	require.Equal(t, []any{"payment.failed"}, ep["enabled_events"])
	rc.trust(ep["secret"].(string))
	id := ep["id"].(string)

	b.createPayment(t, k.Secret, 1000) // succeeded: not taken
	declined := b.post(t, "/v1/payments", k.Secret, "declined", `{"amount": 1002, "currency": "eur"}`)
	require.Equal(t, http.StatusCreated, declined.Status)
	require.Equal(t, "failed", b.settled(t, "/v1/payments/"+decode(t, declined.Body)["id"].(string), k.Secret)["status"])
	b.attemptsOf(t, k.Secret, id, 1)
	require.Equal(t, []string{"payment.failed"}, eventTypes(t, rc.deliveries()))

	r = b.patchEndpoint(t, k.Secret, id, `{"enabled_events": ["*"]}`)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	b.createPayment(t, k.Secret, 3000)
	b.attemptsOf(t, k.Secret, id, 2)
	require.Equal(t, []string{"payment.failed", "payment.succeeded"}, eventTypes(t, rc.deliveries()))
	requireProblem(t, b.patchEndpoint(t, k.Secret, id, `{}`), http.StatusBadRequest, "validation-failed")
	requireProblem(t, b.patchEndpoint(t, k.Secret, id, `{"status": "deleted"}`), http.StatusBadRequest, "validation-failed")
}

// A disabled endpoint (by a 410, or by its owner) is enabled again by its
// owner and gets the next events; a resend or a recover to it while it is
// disabled is refused without storing anything, and the same request, with
// the same key, succeeds once it is enabled.
func TestWebhookEndpointIsEnabledAgain(t *testing.T) {
	t.Parallel()
	b, k, rc, id := webhookSetup(t)
	rc.before = func(w http.ResponseWriter, _ *http.Request, n int) bool {
		if n == 1 {
			w.WriteHeader(http.StatusGone)
			return true
		}
		return false
	}
	b.createPayment(t, k.Secret, 1000)
	b.attemptsOf(t, k.Secret, id, 1)
	var ep map[string]any
	require.Eventually(t, func() bool {
		ep = decode(t, b.get(t, "/v1/webhook_endpoints/"+id, k.Secret).Body)
		return ep["status"] == webhooks.StatusDisabled
	}, settleWithin, 20*time.Millisecond)
	require.Equal(t, webhooks.ReasonReceiverGone, ep["disabled_reason"])

	events := b.listed(t, "/v1/events", k.Secret, 1)["data"].([]any)
	eventID := events[0].(map[string]any)["id"].(string)
	resend := func() response {
		return b.post(t, "/v1/webhook_endpoints/"+id+"/resend", k.Secret, "resend-1", `{"event_id": "`+eventID+`"}`)
	}
	requireProblem(t, resend(), http.StatusConflict, "webhook-endpoint-disabled")
	requireProblem(t, b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover-1", `{"since": "2026-01-01T00:00:00Z"}`),
		http.StatusConflict, "webhook-endpoint-disabled")
	require.Zero(t, b.unfinished(t, "deliver_webhook"))

	r := b.patchEndpoint(t, k.Secret, id, `{"status": "enabled"}`)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	ep = decode(t, r.Body)
	require.Equal(t, webhooks.StatusEnabled, ep["status"])
	require.Nil(t, ep["disabled_reason"])

	r = resend()
	require.Equal(t, http.StatusAccepted, r.Status, "the refused resend consumed no key: %s", r.Body)
	require.Equal(t, map[string]any{"endpoint_id": id, "queued": float64(1)}, decode(t, r.Body))
	b.attemptsOf(t, k.Secret, id, 2)
	got := rc.deliveries()
	require.Len(t, got, 2)
	require.Equal(t, eventID, got[1].header.Get("webhook-id"), "a resend carries the event's own webhook-id")
	replay := resend()
	require.Equal(t, http.StatusAccepted, replay.Status)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))

	b.createPayment(t, k.Secret, 2000)
	b.attemptsOf(t, k.Secret, id, 3)

	r = b.patchEndpoint(t, k.Secret, id, `{"status": "disabled"}`)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, webhooks.ReasonRequested, decode(t, r.Body)["disabled_reason"])
	requireProblem(t, b.post(t, "/v1/webhook_endpoints/"+id+"/resend", k.Secret, "resend-2", `{"event_id": "01936f4e-9b2d-7c4f-8a3b-5d6e7f8a9b0c"}`),
		http.StatusConflict, "webhook-endpoint-disabled")
	r = b.patchEndpoint(t, k.Secret, id, `{"status": "enabled"}`)
	require.Equal(t, http.StatusOK, r.Status)
	requireProblem(t, b.post(t, "/v1/webhook_endpoints/"+id+"/resend", k.Secret, "resend-2", `{"event_id": "01936f4e-9b2d-7c4f-8a3b-5d6e7f8a9b0c"}`),
		http.StatusNotFound, "not-found")
}

// Recover sends an endpoint every event of a window that it takes, oldest
// first; a window of more than MaxRecoverEvents events is refused, and
// nothing is queued.
func TestWebhookRecoverSendsAWindowAgain(t *testing.T) {
	t.Parallel()
	b, k, rc, id := webhookSetup(t)
	b.createPayment(t, k.Secret, 1000)
	b.createPayment(t, k.Secret, 2000)
	b.attemptsOf(t, k.Secret, id, 2)
	first := rc.deliveries()

	r := b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover", `{"since": "2026-01-01T00:00:00Z"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.EqualValues(t, 2, decode(t, r.Body)["queued"])
	b.attemptsOf(t, k.Secret, id, 4)
	again := rc.deliveries()[2:]
	require.ElementsMatch(t, []string{first[0].header.Get("webhook-id"), first[1].header.Get("webhook-id")},
		[]string{again[0].header.Get("webhook-id"), again[1].header.Get("webhook-id")})

	r = b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover-empty", `{"since": "2026-01-01T00:00:00Z", "until": "2026-01-02T00:00:00Z"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.EqualValues(t, 0, decode(t, r.Body)["queued"])
	requireProblem(t, b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover-bad", `{"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}`),
		http.StatusBadRequest, "validation-failed")
	requireProblem(t, b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover-bad", `{}`),
		http.StatusBadRequest, "validation-failed")

	// More than MaxRecoverEvents events in the window, made a year ago.
	_, err := b.admin.Exec(context.Background(), `
		INSERT INTO events (id, principal_id, type, data, livemode, created_at)
		SELECT gen_random_uuid(), principal_id, 'payment.succeeded', '{"object": {}}', false, '2025-12-01'::timestamptz + n * interval '1 second'
		FROM webhook_endpoints, generate_series(1, $2) AS n WHERE id = $1`, id, webhooks.MaxRecoverEvents+1)
	require.NoError(t, err)
	jobs := b.jobs(t, `kind = 'deliver_webhook'`)
	requireProblem(t, b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover-all", `{"since": "2025-11-01T00:00:00Z"}`),
		http.StatusUnprocessableEntity, "too-many-events-to-recover")
	require.Equal(t, jobs, b.jobs(t, `kind = 'deliver_webhook'`), "nothing was queued")
	r = b.post(t, "/v1/webhook_endpoints/"+id+"/recover", k.Secret, "recover-part", `{"since": "2025-11-01T00:00:00Z", "until": "2025-12-01T00:00:11Z"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.EqualValues(t, 10, decode(t, r.Body)["queued"])
}

// An endpoint whose every attempt has failed for DisableAfter is disabled,
// and its owner is told: a webhook_endpoint.disabled event, listable and
// sent to their endpoints that take it. A delivered attempt ends a run of
// failures.
func TestWebhookFailingEndpointIsDisabledAndItsOwnerTold(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.disableAfter = 200 * time.Millisecond })
	k := b.newKey(t, "acme", allScopes...)
	rc := b.receiver(t)
	failingEP := b.registerEndpoint(t, k.Secret, rc.srv.URL+"/failing")
	failing := failingEP["id"].(string)
	watcher := decode(t, b.post(t, "/v1/webhook_endpoints", k.Secret, "watcher",
		`{"url": "`+rc.srv.URL+`/watcher", "enabled_events": ["webhook_endpoint.disabled"]}`).Body)
	rc.trust(watcher["secret"].(string))
	rc.before = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		if r.URL.Path == "/failing" {
			time.Sleep(50 * time.Millisecond)
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	b.createPayment(t, k.Secret, 1000)
	var ep map[string]any
	require.Eventually(t, func() bool {
		ep = decode(t, b.get(t, "/v1/webhook_endpoints/"+failing, k.Secret).Body)
		return ep["status"] == webhooks.StatusDisabled
	}, settleWithin, 20*time.Millisecond)
	require.Equal(t, webhooks.ReasonFailing, ep["disabled_reason"])
	require.NotNil(t, ep["failing_since"])

	page := b.listed(t, "/v1/events", k.Secret, 2)["data"].([]any)
	disabled := page[1].(map[string]any)
	require.Equal(t, webhooks.EventDisabled, disabled["type"])
	object := disabled["data"].(map[string]any)["object"].(map[string]any)
	require.Equal(t, failing, object["id"])
	require.Equal(t, webhooks.ReasonFailing, object["disabled_reason"])
	require.Nil(t, object["secret"], "an event never shows a secret")
	b.attemptsOf(t, k.Secret, watcher["id"].(string), 1)
	var toWatcher []string
	for _, d := range rc.deliveries() {
		if d.header.Get("webhook-id") == disabled["id"] {
			toWatcher = append(toWatcher, d.header.Get("webhook-id"))
		}
	}
	require.Len(t, toWatcher, 1, "the watcher got the event once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM events WHERE type = 'webhook_endpoint.disabled'`),
		"later failed attempts of the disabled endpoint's other jobs record no second event")

	// Enabled again: a failed attempt starts a run, a delivered one ends it.
	rc.trust(watcher["secret"].(string), failingEP["secret"].(string))
	var failedOnce atomic.Bool
	rc.before = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		if r.URL.Path == "/failing" && failedOnce.CompareAndSwap(false, true) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	r := b.patchEndpoint(t, k.Secret, failing, `{"status": "enabled"}`)
	require.Equal(t, http.StatusOK, r.Status)
	require.Nil(t, decode(t, r.Body)["failing_since"])
	b.createPayment(t, k.Secret, 2000)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND status_code = 200`, failing) == 1
	}, settleWithin, 20*time.Millisecond)
	require.True(t, failedOnce.Load())
	// The failed attempt may be recorded after the delivered one when they
	// belong to two jobs (the first payment's event is still being retried):
	// its run then ends at the next delivered attempt.
	require.Eventually(t, func() bool {
		ep = decode(t, b.get(t, "/v1/webhook_endpoints/"+failing, k.Secret).Body)
		return ep["failing_since"] == nil
	}, settleWithin, 20*time.Millisecond, "a delivered attempt never ended the run of failures")
	require.Equal(t, webhooks.StatusEnabled, ep["status"])
}

// At most Concurrency attempts to one endpoint run at once, whatever the
// webhook workers could run; the others wait their turn without spending
// an attempt, and every event is delivered.
func TestWebhookEndpointConcurrencyIsBounded(t *testing.T) {
	t.Parallel()
	const limit = 1 // of the tests' two webhook workers
	b, k, rc, id := webhookSetup(t, func(o *options) { o.endpointConcurrency = limit })
	var mu sync.Mutex
	inFlight, most := 0, 0
	rc.before = func(http.ResponseWriter, *http.Request, int) bool {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		inFlight--
		mu.Unlock()
		return false
	}
	const payments = 6
	for range payments {
		r := b.post(t, "/v1/payments", k.Secret, "payment-"+randomSuffix(), `{"amount": 1000, "currency": "eur"}`)
		require.Equal(t, http.StatusCreated, r.Status)
	}
	for _, a := range b.attemptsOf(t, k.Secret, id, payments) {
		require.EqualValues(t, 1, a["attempt"], "waiting for a turn spent no attempt")
		require.EqualValues(t, 200, a["status_code"])
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, limit, most, "attempts to one endpoint in flight at once")
	require.Zero(t, b.count(t, `SELECT count(*) FROM webhook_endpoint_leases`), "every lease was given back")
}

// Concurrent registrations never take more than MaxEndpoints places: the
// per-principal lock makes each count and its INSERT one decision.
func TestWebhookEndpointLimitHoldsUnderConcurrentCreations(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 8 })
	k := b.newKey(t, "acme", allScopes...)
	const tries = 3 * webhooks.MaxEndpoints
	statuses := make(chan int, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() {
			r := b.post(t, "/v1/webhook_endpoints", k.Secret, "concurrent-"+itoa(i), `{"url": "http://127.0.0.1:9/hook"}`)
			statuses <- r.Status
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	require.Equal(t, map[int]int{http.StatusCreated: webhooks.MaxEndpoints, http.StatusUnprocessableEntity: tries - webhooks.MaxEndpoints}, count)
	require.Equal(t, webhooks.MaxEndpoints, b.count(t, `SELECT count(*) FROM webhook_endpoints`))
}

// A replay whose body was too large to store keeps the status of the
// request it replays: 200 for a change or a deletion, not the 201 of a
// creation, and its body shows the endpoint as it is now.
func TestARederivedReplayKeepsItsStatus(t *testing.T) {
	t.Parallel()
	b, k, _, id := webhookSetup(t, func(o *options) { o.maxStored = 10 })
	for _, c := range []call{
		{method: http.MethodPatch, path: "/v1/webhook_endpoints/" + id, secret: k.Secret, key: "patch", body: `{"status": "disabled"}`},
		{method: http.MethodPost, path: "/v1/webhook_endpoints/" + id + "/rotate_secret", secret: k.Secret, key: "rotate"},
		{method: http.MethodDelete, path: "/v1/webhook_endpoints/" + id, secret: k.Secret, key: "delete"},
	} {
		first := b.do(t, c)
		require.Equal(t, http.StatusOK, first.Status, "%s %s: %s", c.method, c.path, first.Body)
		again := b.do(t, c)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "%s %s", c.method, c.path)
		require.Equal(t, http.StatusOK, again.Status, "%s %s replayed: %s", c.method, c.path, again.Body)
		require.Equal(t, id, decode(t, again.Body)["id"])
	}
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE response_ref IS NOT NULL AND response_body IS NULL AND key IN ('patch', 'rotate', 'delete')`))
}
