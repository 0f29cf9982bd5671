package httpapi_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/payments-reference/idempotent-payments/client"
	"github.com/payments-reference/idempotent-payments/examples/webhook-receiver/receiver"
	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// The resources the webhook operations' requests name, for the tests that
// send every operation's requests (newTarget, fillIn in examples_test.go):
// an endpoint of the caller's, and an event of theirs to send again.
func init() {
	newTarget["/v1/webhook_endpoints/"] = func(t *testing.T, b *testBundle, secret string) string {
		return b.registerEndpoint(t, secret, "http://127.0.0.1:9/")["id"].(string)
	}
	fillIn["event_id"] = func(t *testing.T, b *testBundle, secret string) any {
		b.createPayment(t, secret, 1000)
		return b.listed(t, "/v1/events", secret, 1)["data"].([]any)[0].(map[string]any)["id"]
	}
}

// delivery is one request a test receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// testReceiver is the example receiver (package receiver) on the test's
// database, behind a handler that a test can make misbehave first.
type testReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []delivery
	// before, when set, answers a delivery instead of the receiver, when
	// it returns true; n counts the deliveries so far (1 for the first).
	before func(w http.ResponseWriter, r *http.Request, n int) bool
	// after, when set, runs once the receiver applied a delivery, in place
	// of its 200: a test drops the answer with it.
	after func(w http.ResponseWriter, n int) bool
	// secrets verify the deliveries: the endpoint's, known once it is
	// registered (trust).
	secrets []string
	n       atomic.Int64
}

// trust sets the secrets the receiver verifies deliveries with.
func (rc *testReceiver) trust(secrets ...string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.secrets = secrets
}

func (b *testBundle) receiver(t *testing.T) *testReceiver {
	t.Helper()
	_, err := b.admin.Exec(context.Background(), receiver.Schema)
	require.NoError(t, err)
	rc := &testReceiver{}
	r := &receiver.Receiver{Pool: b.admin}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		n := int(rc.n.Add(1))
		rc.mu.Lock()
		rc.got = append(rc.got, delivery{header: req.Header.Clone(), body: body})
		before, after, secrets := rc.before, rc.after, rc.secrets
		rc.mu.Unlock()
		if before != nil && before(w, req, n) {
			return
		}
		req.Body = io.NopCloser(strings.NewReader(string(body)))
		rec := httptest.NewRecorder()
		client.WebhookHandler(r.Apply, secrets...).ServeHTTP(rec, req)
		if rec.Code == http.StatusOK && after != nil && after(w, n) {
			return
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *testReceiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

// registerEndpoint registers url and returns the endpoint as created.
func (b *testBundle) registerEndpoint(t *testing.T, secret, url string) map[string]any {
	t.Helper()
	r := b.post(t, "/v1/webhook_endpoints", secret, "endpoint-"+randomSuffix(), `{"url": "`+url+`"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	return decode(t, r.Body)
}

// A payment's outcome reaches the client's endpoint as a signed event, and
// the example receiver applies it once; the event names the request that
// made the payment, shows the payment as GET does, is listable, and its
// delivery is recorded and traced in the request's trace.
func TestWebhookDeliversAPaymentsOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	rc := b.receiver(t)
	ep := b.registerEndpoint(t, k.Secret, rc.srv.URL)
	require.True(t, strings.HasPrefix(ep["secret"].(string), "whsec_"))
	rc.trust(ep["secret"].(string))
	endpointID := ep["id"].(string)

	created := b.post(t, "/v1/payments", k.Secret, "pay-1", paymentBody)
	require.Equal(t, http.StatusCreated, created.Status)
	pay := decode(t, created.Body)["id"].(string)
	got := b.settled(t, "/v1/payments/"+pay, k.Secret)
	require.Eventually(t, func() bool { return b.effects(t, pay) == 1 }, settleWithin, 20*time.Millisecond, "the receiver never applied the event")

	page := b.listed(t, "/v1/events", k.Secret, 1)
	events := page["data"].([]any)
	require.Len(t, events, 1)
	ev := events[0].(map[string]any)
	require.Equal(t, "payment.succeeded", ev["type"])
	require.Equal(t, got, ev["data"].(map[string]any)["object"], "the event shows the payment as GET does")
	require.Equal(t, map[string]any{"id": created.Header.Get("X-Request-Id"), "idempotency_key": "pay-1"}, ev["request"])
	require.Equal(t, ev, decode(t, b.get(t, "/v1/events/"+ev["id"].(string), k.Secret).Body))

	ds := rc.deliveries()
	require.Len(t, ds, 1)
	require.Equal(t, ev["id"], ds[0].header.Get("webhook-id"))
	require.JSONEq(t, string(b.get(t, "/v1/events/"+ev["id"].(string), k.Secret).Body), string(ds[0].body), "the body is the event")

	attempts := b.listed(t, "/v1/webhook_endpoints/"+endpointID+"/deliveries", k.Secret, 1)["data"].([]any)
	require.Len(t, attempts, 1)
	a := attempts[0].(map[string]any)
	require.EqualValues(t, 200, a["status_code"])
	require.EqualValues(t, 1, a["attempt"])
	require.Equal(t, ev["id"], a["event_id"])

	// One trace: the request, the charge, the delivery.
	server := b.spansNamed("POST /v1/payments")
	require.Len(t, server, 1)
	require.Eventually(t, func() bool { return len(b.spansNamed("outbox deliver_webhook")) > 0 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, server[0].SpanContext().TraceID(), b.spansNamed("outbox deliver_webhook")[0].SpanContext().TraceID())

	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	delivered := int64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "webhook_deliveries" {
				for _, dp := range sum.DataPoints {
					if v, _ := dp.Attributes.Value("outcome"); v.AsString() == webhooks.OutcomeDelivered {
						delivered += dp.Value
					}
				}
			}
		}
	}
	require.EqualValues(t, 1, delivered)
	require.Zero(t, b.gauge(t, "webhook_oldest_undelivered_age_seconds"))
}

// webhookSetup is a bundle with a key, a receiver, and an endpoint that
// points at it.
func webhookSetup(t *testing.T, tweak ...func(*options)) (*testBundle, auth.NewKey, *testReceiver, string) {
	t.Helper()
	b := setup(t, tweak...)
	k := b.newKey(t, "acme", allScopes...)
	rc := b.receiver(t)
	ep := b.registerEndpoint(t, k.Secret, rc.srv.URL)
	rc.trust(ep["secret"].(string))
	return b, k, rc, ep["id"].(string)
}

// attemptsOf lists an endpoint's delivery attempts once there are n.
func (b *testBundle) attemptsOf(t *testing.T, secret, endpointID string, n int) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, a := range b.listed(t, "/v1/webhook_endpoints/"+endpointID+"/deliveries", secret, n)["data"].([]any) {
		out = append(out, a.(map[string]any))
	}
	return out
}

// A receiver that fails three times gets the event once more each time,
// on the schedule, and applies it once; every attempt is listed.
func TestWebhookRetriesUntilTheReceiverTakesIt(t *testing.T) {
	t.Parallel()
	b, k, rc, endpointID := webhookSetup(t)
	rc.before = func(w http.ResponseWriter, _ *http.Request, n int) bool {
		if n <= 3 {
			w.WriteHeader(http.StatusInternalServerError)
			return true
		}
		return false
	}
	pay := b.createPayment(t, k.Secret, 1000)
	require.Eventually(t, func() bool { return b.effects(t, pay) == 1 }, settleWithin, 20*time.Millisecond)

	attempts := b.attemptsOf(t, k.Secret, endpointID, 4)
	require.Len(t, attempts, 4)
	for i, a := range attempts {
		require.EqualValues(t, i+1, a["attempt"])
		want := 500
		if i == 3 {
			want = 200
		}
		require.EqualValues(t, want, a["status_code"])
	}
	ds := rc.deliveries()
	require.Len(t, ds, 4)
	for _, d := range ds {
		require.Equal(t, ds[0].header.Get("webhook-id"), d.header.Get("webhook-id"), "every attempt is the same event")
	}
	require.Equal(t, 1, b.effects(t, pay))
}

// A receiver whose malformed answer makes a long error of multi-byte
// characters still gets its attempt recorded: the error is cut on a
// character's boundary (cut at 500 bytes, it was invalid UTF-8, PostgreSQL
// refused the record with SQLSTATE 22021, and the list stayed empty).
func TestWebhookAttemptWithALongErrorIsRecorded(t *testing.T) {
	t.Parallel()
	b, k, rc, endpointID := webhookSetup(t)
	rc.before = func(w http.ResponseWriter, _ *http.Request, n int) bool {
		if n > 1 {
			return false
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return true
		}
		// net/http quotes the bad status line in its error, é as is.
		_, _ = buf.WriteString("HTTP/1.1 2" + strings.Repeat("é", 400) + " OK\r\n\r\n")
		_ = buf.Flush()
		_ = conn.Close()
		return true
	}
	b.createPayment(t, k.Secret, 1000)
	attempts := b.attemptsOf(t, k.Secret, endpointID, 2)
	require.Nil(t, attempts[0]["status_code"])
	msg := attempts[0]["error"].(string)
	require.Contains(t, msg, "malformed HTTP")
	require.True(t, utf8.ValidString(msg))
	require.LessOrEqual(t, utf8.RuneCountInString(msg), webhooks.MaxErrorLength)
	require.EqualValues(t, 200, attempts[1]["status_code"], "the next attempt is delivered")
}

// A receiver that applies the event but whose 200 never arrives gets the
// event again, and applies it still once: at least once on the wire,
// exactly once in effect.
func TestWebhookLostAnswerIsAppliedOnce(t *testing.T) {
	t.Parallel()
	b, k, rc, endpointID := webhookSetup(t)
	rc.after = func(w http.ResponseWriter, n int) bool {
		if n > 1 {
			return false
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close() // applied and committed; the answer is lost
		}
		return true
	}
	pay := b.createPayment(t, k.Secret, 1000)
	attempts := b.attemptsOf(t, k.Secret, endpointID, 2)
	require.Nil(t, attempts[0]["status_code"], "the first attempt got no answer")
	require.NotNil(t, attempts[0]["error"])
	require.EqualValues(t, 200, attempts[1]["status_code"])
	require.Len(t, rc.deliveries(), 2)
	require.Equal(t, 1, b.effects(t, pay), "delivered twice, applied once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM received_webhooks`))
}

// A 410 from the receiver disables the endpoint: no later event is sent.
func TestWebhookGoneDisablesTheEndpoint(t *testing.T) {
	t.Parallel()
	b, k, rc, endpointID := webhookSetup(t)
	rc.before = func(w http.ResponseWriter, _ *http.Request, _ int) bool {
		w.WriteHeader(http.StatusGone)
		return true
	}
	b.createPayment(t, k.Secret, 1000)
	attempts := b.attemptsOf(t, k.Secret, endpointID, 1)
	require.EqualValues(t, 410, attempts[0]["status_code"])
	require.Eventually(t, func() bool {
		return decode(t, b.get(t, "/v1/webhook_endpoints/"+endpointID, k.Secret).Body)["status"] == webhooks.StatusDisabled
	}, settleWithin, 20*time.Millisecond)

	b.createPayment(t, k.Secret, 2000)
	b.listed(t, "/v1/events", k.Secret, 2)
	require.Zero(t, b.unfinished(t, "deliver_webhook"),
		"no delivery was queued for the disabled endpoint")
	require.Len(t, rc.deliveries(), 1)
}

// A rotation shows the new secret once; for 24 hours deliveries carry a
// signature by each secret, and a receiver that knows either one accepts
// them. Neither secret is stored anywhere: the replay of the rotation
// derives it again, the same bytes.
func TestWebhookSecretRotation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	rc := b.receiver(t)
	created := b.post(t, "/v1/webhook_endpoints", k.Secret, "create-endpoint", `{"url": "`+rc.srv.URL+`", "description": "orders"}`)
	require.Equal(t, http.StatusCreated, created.Status)
	ep := decode(t, created.Body)
	oldSecret, id := ep["secret"].(string), ep["id"].(string)

	rotated := b.post(t, "/v1/webhook_endpoints/"+id+"/rotate_secret", k.Secret, "rotate-1", "")
	require.Equal(t, http.StatusOK, rotated.Status, "%s", rotated.Body)
	after := decode(t, rotated.Body)
	newSecret := after["secret"].(string)
	require.NotEqual(t, oldSecret, newSecret)
	until, err := time.Parse(time.RFC3339Nano, after["previous_secret_expires_at"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), until, time.Minute)

	// Replays show the same bytes, secret included...
	for _, c := range []struct {
		path, key, body string
		first           response
	}{
		{"/v1/webhook_endpoints", "create-endpoint", `{"url": "` + rc.srv.URL + `", "description": "orders"}`, created},
		{"/v1/webhook_endpoints/" + id + "/rotate_secret", "rotate-1", "", rotated},
	} {
		again := b.post(t, c.path, k.Secret, c.key, c.body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		if c.key == "create-endpoint" {
			// ...of the endpoint as it is now: the rotation set
			// previous_secret_expires_at since.
			first, replay := decode(t, c.first.Body), decode(t, again.Body)
			require.Equal(t, first["secret"], replay["secret"])
			continue
		}
		require.Equal(t, string(c.first.Body), string(again.Body))
	}
	// ...which the database holds nowhere.
	for _, secret := range []string{oldSecret, newSecret} {
		require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE position($1 in convert_from(coalesce(response_body, ''), 'UTF8')) > 0`, secret))
		require.Zero(t, b.count(t, `SELECT count(*) FROM webhook_endpoints e WHERE position($1 in row_to_json(e)::text) > 0`, secret))
	}
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE response_body IS NULL AND response_ref LIKE $1`, id+"/%"))

	rc.trust(newSecret)
	pay := b.createPayment(t, k.Secret, 1000)
	require.Eventually(t, func() bool { return b.effects(t, pay) == 1 }, settleWithin, 20*time.Millisecond)
	d := rc.deliveries()[0]
	require.Len(t, strings.Fields(d.header.Get("webhook-signature")), 2, "two signatures during the overlap")
	require.NoError(t, client.VerifyWebhook(d.header, d.body, oldSecret), "a receiver still on the old secret accepts")
	require.NoError(t, client.VerifyWebhook(d.header, d.body, newSecret), "a receiver already on the new secret accepts")
	require.Error(t, client.VerifyWebhook(d.header, d.body, "whsec_"+strings.Repeat("A", 43)+"="))
}

// Endpoints are bounded, listed without secrets, and deleted idempotently.
func TestWebhookEndpointLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	var ids []string
	for i := range webhooks.MaxEndpoints {
		ids = append(ids, b.registerEndpoint(t, k.Secret, "http://127.0.0.1:9/hook-"+itoa(i))["id"].(string))
	}
	over := b.post(t, "/v1/webhook_endpoints", k.Secret, "one-too-many", `{"url": "http://127.0.0.1:9/more"}`)
	requireProblem(t, over, http.StatusUnprocessableEntity, "too-many-webhook-endpoints")
	again := b.post(t, "/v1/webhook_endpoints", k.Secret, "one-too-many", `{"url": "http://127.0.0.1:9/more"}`)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "a business rejection is stored and replayed")

	list := decode(t, b.get(t, "/v1/webhook_endpoints", k.Secret).Body)["data"].([]any)
	require.Len(t, list, webhooks.MaxEndpoints)
	for _, e := range list {
		require.NotContains(t, e, "secret")
	}

	del := b.do(t, call{method: http.MethodDelete, path: "/v1/webhook_endpoints/" + ids[0], secret: k.Secret, key: "delete-0"})
	require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	require.Equal(t, webhooks.StatusDeleted, decode(t, del.Body)["status"])
	replay := b.do(t, call{method: http.MethodDelete, path: "/v1/webhook_endpoints/" + ids[0], secret: k.Secret, key: "delete-0"})
	require.Equal(t, string(del.Body), string(replay.Body))
	gone := b.do(t, call{method: http.MethodDelete, path: "/v1/webhook_endpoints/" + ids[0], secret: k.Secret, key: "delete-0-again"})
	requireProblem(t, gone, http.StatusNotFound, "not-found")
	requireProblem(t, b.get(t, "/v1/webhook_endpoints/"+ids[0], k.Secret), http.StatusNotFound, "not-found")
	require.Len(t, decode(t, b.get(t, "/v1/webhook_endpoints", k.Secret).Body)["data"], webhooks.MaxEndpoints-1)
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/webhook_endpoints", k.Secret, "after-delete", `{"url": "http://127.0.0.1:9/more"}`).Status)

	// Another principal sees none of them; a key without the scope gets 403.
	other := b.newKey(t, "globex", allScopes...)
	require.Empty(t, decode(t, b.get(t, "/v1/webhook_endpoints", other.Secret).Body)["data"])
	requireProblem(t, b.get(t, "/v1/webhook_endpoints/"+ids[1], other.Secret), http.StatusNotFound, "not-found")
	reader := b.newKey(t, "acme", auth.ScopePaymentsRead, auth.ScopePaymentsWrite, auth.ScopeRefundsRead, auth.ScopeRefundsWrite)
	requireProblem(t, b.get(t, "/v1/webhook_endpoints", reader.Secret), http.StatusForbidden, "forbidden")
	requireProblem(t, b.get(t, "/v1/events", reader.Secret), http.StatusForbidden, "forbidden")
}

// Every form of a URL that would reach the service's own network is
// refused, before anything is stored: a private or special address, a name
// that resolves to one, http, user information.
func TestWebhookURLsThatReachInsideAreRefused(t *testing.T) {
	t.Parallel()
	names := map[string][]netip.Addr{
		"public.example":   {netip.MustParseAddr("93.184.215.14")},
		"loopback.example": {netip.MustParseAddr("127.0.0.1")},
		"mixed.example":    {netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("10.1.2.3")},
		"metadata.example": {netip.MustParseAddr("169.254.169.254")},
	}
	policy := webhooks.URLPolicy{Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
		if a, ok := names[host]; ok {
			return a, nil
		}
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host) // localhost: the system's answer
	}}
	b := setup(t, func(o *options) { o.urls = policy })
	k := b.newKey(t, "acme", allScopes...)
	for _, url := range []string{
		"http://public.example/hook",               // not https
		"https://127.0.0.1/hook",                   // loopback
		"https://[::1]/hook",                       // loopback, IPv6
		"https://[::ffff:127.0.0.1]/hook",          // loopback, IPv4-mapped
		"https://localhost/hook",                   // a name the system resolves to loopback
		"https://loopback.example/hook",            // a name that resolves to loopback
		"https://mixed.example/hook",               // one public and one private address
		"https://10.0.0.1/hook",                    // private
		"https://172.16.5.4/hook",                  // private
		"https://192.168.1.1/hook",                 // private
		"https://[fd00::1]/hook",                   // unique local
		"https://169.254.169.254/latest/meta-data", // link-local: the cloud metadata service
		"https://metadata.example/",                // a name for it
		"https://[fe80::1]/hook",                   // link-local, IPv6
		"https://0.0.0.0/hook",                     // unspecified
		"https://100.64.0.1/hook",                  // shared address space
		"https://224.0.0.1/hook",                   // multicast
		"https://[::127.0.0.1]/hook",               // IPv4-compatible
		"https://[::ffff:0:7f00:1]/hook",           // SIIT
		"https://[2002:7f00:1::]/hook",             // 6to4
		"https://[fec0::1]/hook",                   // site-local
		"https://[64:ff9b:1::a00:1]/hook",          // NAT64, local-use prefix
		"https://[2001::1]/hook",                   // Teredo
		"https://user:pass@public.example/hook",    // user information
		"https://no-such-host.invalid/hook",        // does not resolve
		"ftp://public.example/hook",                // not http at all
		"/hook",                                    // not absolute
	} {
		r := b.post(t, "/v1/webhook_endpoints", k.Secret, "url-"+randomSuffix(), `{"url": "`+url+`"}`)
		requireProblem(t, r, http.StatusBadRequest, "validation-failed")
		require.Equal(t, "url", decode(t, r.Body)["errors"].([]any)[0].(map[string]any)["field"], url)
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM webhook_endpoints`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys`), "a refused URL consumes no key")
	r := b.post(t, "/v1/webhook_endpoints", k.Secret, "url-"+randomSuffix(), `{"url": "https://loopback.example/hook"}`)
	require.NotContains(t, string(r.Body), "127.0.0.1", "the address a name resolves to stays unsaid")
	ok := b.post(t, "/v1/webhook_endpoints", k.Secret, "public", `{"url": "https://public.example/hook"}`)
	require.Equal(t, http.StatusCreated, ok.Status, "%s", ok.Body)
}

// An unauthenticated (or unauthorized) request to register an endpoint is
// refused before the URL's host is looked up: no anonymous request makes
// the service resolve a name of its choosing.
func TestWebhookURLIsResolvedOnlyForAnAuthenticatedCaller(t *testing.T) {
	t.Parallel()
	var lookups atomic.Int32
	policy := webhooks.URLPolicy{Resolve: func(context.Context, string) ([]netip.Addr, error) {
		lookups.Add(1)
		return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
	}}
	b := setup(t, func(o *options) { o.urls = policy })
	body := `{"url": "https://attacker.example/hook"}`
	r := b.post(t, "/v1/webhook_endpoints", "sk_test_"+strings.Repeat("0", 40), "anon", body)
	requireProblem(t, r, http.StatusUnauthorized, "unauthenticated")
	payer := b.newKey(t, "acme", "payments:write")
	r = b.post(t, "/v1/webhook_endpoints", payer.Secret, "no-scope", body)
	requireProblem(t, r, http.StatusForbidden, "forbidden")
	require.Zero(t, lookups.Load(), "the host was looked up for a caller who may not register endpoints")

	k := b.newKey(t, "acme", allScopes...)
	r = b.post(t, "/v1/webhook_endpoints", k.Secret, "ok", body)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.EqualValues(t, 1, lookups.Load())
}

// The noisy neighbour: tenant A's receiver never answers, and A's
// deliveries hold every webhook worker; tenant B's payment is still
// charged, while every one of A's attempts is still held. Deliveries and
// processor calls have queues and workers of their own (outbox.Queue*).
// With one queue for both, B's charge waited for a worker that only a
// delivery attempt's end could free: in the run the issue reports, 29.1 s.
func TestSlowReceiversOfOneTenantDoNotDelayAnothersCharges(t *testing.T) {
	t.Parallel()
	// Attempts bounded far beyond the test: nothing ends A's deliveries but
	// the test itself.
	b := setup(t, func(o *options) { o.webhookTimeout, o.jobTimeout = 5*time.Minute, 5*time.Minute })
	a := b.newKey(t, "tenant-a", allScopes...)
	bKey := b.newKey(t, "tenant-b", allScopes...)

	var held, ended atomic.Int32
	rc := b.receiver(t)
	release := make(chan struct{})
	// Registered after the receiver, so it runs before the receiver's
	// server waits for its handlers to return.
	t.Cleanup(sync.OnceFunc(func() { close(release) }))
	rc.before = func(w http.ResponseWriter, r *http.Request, _ int) bool {
		held.Add(1)
		defer ended.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	}
	b.registerEndpoint(t, a.Secret, rc.srv.URL)
	for range 2 * webhookWorkers {
		b.createPayment(t, a.Secret, 1000)
	}
	require.Eventually(t, func() bool { return held.Load() == webhookWorkers }, settleWithin, 10*time.Millisecond,
		"A's deliveries never held every webhook worker")

	b.createPayment(t, bKey.Secret, 1000) // returns once it is charged
	require.Zero(t, ended.Load(), "B's charge waited until one of A's delivery attempts ended")
	require.EqualValues(t, webhookWorkers, held.Load(), "A's other deliveries wait for a webhook worker")
}
