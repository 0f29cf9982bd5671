package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// spansNamed returns the ended spans with the given name, oldest first.
func (b *testBundle) spansNamed(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

func TestReplaySpanLinksToTheOriginal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	first := b.post(t, "/v1/payments", k.Secret, "traced", paymentBody)
	second := b.post(t, "/v1/payments", k.Secret, "traced", paymentBody)
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	b.post(t, "/v1/payments", k.Secret, "traced", `{"amount": 1, "currency": "usd"}`)

	steps := b.spansNamed("idempotency")
	require.Len(t, steps, 3)
	original, replay, mismatch := steps[0], steps[1], steps[2]
	require.Equal(t, "claimed", attr(original, "idempotency.outcome"))
	require.Equal(t, "replayed", attr(replay, "idempotency.outcome"))
	require.Equal(t, "mismatch", attr(mismatch, "idempotency.outcome"))
	require.Equal(t, "POST /v1/payments", attr(original, "idempotency.endpoint"))
	require.Equal(t, k.PrincipalID.String(), attr(original, "idempotency.principal_id"))

	require.Len(t, replay.Links(), 1)
	require.Equal(t, original.SpanContext().TraceID(), replay.Links()[0].SpanContext.TraceID())
	require.Equal(t, original.SpanContext().SpanID(), replay.Links()[0].SpanContext.SpanID())
	require.Equal(t, first.Header.Get("X-Request-Id"), attr(replay, "idempotency.original_request_id"))
	require.NotEqual(t, original.SpanContext().TraceID(), replay.SpanContext().TraceID(), "a replay is its own trace")
}

func TestServerSpansAreNamedByRouteTemplate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	created := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	id := decode(t, created.Body)["id"].(string)
	b.get(t, "/v1/payments/"+id, k.Secret)

	for _, name := range []string{"POST /v1/payments", "GET /v1/payments/{id}"} {
		require.Len(t, b.spansNamed(name), 1, name)
	}
	server := b.spansNamed("POST /v1/payments")[0]
	require.Equal(t, created.Header.Get("X-Request-Id"), attr(server, "http.request.id"), "X-Request-Id finds the trace")
	for _, s := range b.spans.Ended() {
		require.NotContains(t, s.Name(), id, "span %q named by a concrete path", s.Name())
	}
	// Each SQL statement has a child span in the request's trace.
	var sqlSpans int
	for _, s := range b.spans.Ended() {
		if s.SpanContext().TraceID() == server.SpanContext().TraceID() && attr(s, "db.system.name") == "postgresql" {
			sqlSpans++
		}
	}
	require.GreaterOrEqual(t, sqlSpans, 4, "authenticate, begin, claim, insert, store, commit")
}

func TestIncomingTraceparentIsHonoured(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	b.do(t, call{method: http.MethodPost, path: "/v1/payments", secret: k.Secret, key: "k", body: paymentBody,
		header: http.Header{"Traceparent": {"00-" + traceID + "-00f067aa0ba902b7-01"}}})
	server := b.spansNamed("POST /v1/payments")
	require.Len(t, server, 1)
	require.Equal(t, traceID, server[0].SpanContext().TraceID().String())
	require.Equal(t, traceID, b.spansNamed("idempotency")[0].SpanContext().TraceID().String())
}

// No span attribute or event carries a request body, a stored response, an
// idempotency key or a secret.
func TestSpansHoldNoRequestData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	const key, description = "key-that-must-not-be-traced", "description-that-must-not-be-traced"
	body := `{"amount": 1000, "currency": "usd", "description": "` + description + `"}`
	created := b.post(t, "/v1/payments", k.Secret, key, body)
	b.post(t, "/v1/payments", k.Secret, key, body)
	id := decode(t, created.Body)["id"].(string)

	var everything strings.Builder
	for _, s := range b.spans.Ended() {
		everything.WriteString(s.Name())
		for _, a := range append(s.Attributes(), s.Resource().Attributes()...) {
			everything.WriteString(" " + string(a.Key) + "=" + a.Value.String())
		}
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				everything.WriteString(" " + string(a.Key) + "=" + a.Value.String())
			}
		}
		for _, l := range s.Links() {
			for _, a := range l.Attributes {
				everything.WriteString(" " + string(a.Key) + "=" + a.Value.String())
			}
		}
	}
	all := everything.String()
	require.Contains(t, all, "idempotency.outcome", "the test must see the spans")
	for _, secret := range []string{key, description, k.Secret, id} {
		require.NotContains(t, all, secret)
	}
}

func TestIdempotencyMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	b.post(t, "/v1/payments", k.Secret, "a", paymentBody)
	b.post(t, "/v1/payments", k.Secret, "a", paymentBody)
	b.post(t, "/v1/payments", k.Secret, "a", `{"amount": 2, "currency": "usd"}`)
	b.post(t, "/v1/payments", k.Secret, "b", paymentBody)
	_, err := b.sweeper.Sweep(context.Background())
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	counts := map[string]int64{}
	var claims uint64
	gauges := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if m.Name == "idempotency_requests" {
						outcome, _ := p.Attributes.Value(attribute.Key("outcome"))
						endpoint, _ := p.Attributes.Value(attribute.Key("endpoint"))
						require.Equal(t, "POST /v1/payments", endpoint.AsString())
						counts[outcome.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "idempotency_claim_duration" {
					for _, p := range d.DataPoints {
						claims += p.Count
					}
				}
			case metricdata.Gauge[int64], metricdata.Gauge[float64]:
				gauges[m.Name] = true
			}
		}
	}
	require.Equal(t, map[string]int64{"claimed": 2, "replayed": 1, "mismatch": 1}, counts)
	require.EqualValues(t, 4, claims)
	for _, g := range []string{"idempotency_keys_rows", "idempotency_keys_bytes", "idempotency_oldest_live_key_age_seconds",
		"idempotency_sweeper_last_run_timestamp"} {
		require.True(t, gauges[g], "gauge %s missing", g)
	}
}

// Every request line has the trace id and request id; see also
// TestLogsHoldNoSecrets.
func TestRequestLogLines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		if m["msg"] == "request" && m["request_id"] == r.Header.Get("X-Request-Id") {
			line = m
		}
	}
	require.NotNil(t, line)
	require.Regexp(t, `^[0-9a-f]{32}$`, line["trace_id"])
	require.Equal(t, "/v1/payments", line["route"])
	require.EqualValues(t, 201, line["status"])
}

// A client reports a 500 with the X-Request-Id it got (also in the problem
// body): the operator finds the error line that explains it, with the trace id,
// by that id alone.
func TestA500sLogLineIsFoundByItsRequestID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	_, err := b.admin.Exec(context.Background(), `
		CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;
		CREATE TRIGGER inject_failure BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION fail();`)
	require.NoError(t, err)
	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	requireProblem(t, r, http.StatusInternalServerError, "internal-error")

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		if m["request_id"] == r.Header.Get("X-Request-Id") {
			lines = append(lines, m)
		}
	}
	msgs := map[any]map[string]any{}
	for _, l := range lines {
		msgs[l["msg"]] = l
		require.Regexp(t, `^[0-9a-f]{32}$`, l["trace_id"], "line %v", l)
	}
	failed := msgs["request failed"]
	require.NotNil(t, failed, "the error line carries the request id; lines: %v", lines)
	require.Equal(t, "ERROR", failed["level"])
	require.Contains(t, failed["error"], "injected failure")
	require.NotNil(t, msgs["request"], "and so does the access line")
	require.Equal(t, msgs["request"]["trace_id"], failed["trace_id"])
}

// One trace shows the request, the outbox job that charged its payment, and
// the processor call the job made.
func TestChargeIsTracedInTheRequestsTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	r := b.post(t, "/v1/payments", k.Secret, "traced", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status)
	b.settled(t, "/v1/payments/"+decode(t, r.Body)["id"].(string), k.Secret)

	server := b.spansNamed("POST /v1/payments")
	require.Len(t, server, 1)
	var job sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		jobs := b.spansNamed("outbox charge_payment")
		if len(jobs) == 0 {
			return false
		}
		job = jobs[0]
		return true
	}, 5*time.Second, 10*time.Millisecond, "no span for the charge job")
	require.Equal(t, server[0].SpanContext().TraceID(), job.SpanContext().TraceID(), "the job is in the request's trace")

	var call sdktrace.ReadOnlySpan
	for _, s := range b.spans.Ended() {
		if s.SpanKind() == trace.SpanKindClient && s.Parent().SpanID() == job.SpanContext().SpanID() && attr(s, "http.request.method") == "POST" {
			call = s
		}
	}
	require.NotNil(t, call, "no processor call under the job's span")
	require.Contains(t, attr(call, "url.full"), "/v1/charges")
}

// The outbox reports its jobs by kind and state and its lag, and every
// processor call's latency by operation and outcome.
func TestOutboxMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	b.createPayment(t, k.Secret, 1000)
	// The simulator declines amounts ending in 02.
	r := b.post(t, "/v1/payments", k.Secret, "declined", `{"amount": 1002, "currency": "usd"}`)
	require.Equal(t, http.StatusCreated, r.Status)
	declined := b.settled(t, "/v1/payments/"+decode(t, r.Body)["id"].(string), k.Secret)
	require.Equal(t, "failed", declined["status"])
	require.Equal(t, "card_declined", declined["failure_reason"])

	var rm metricdata.ResourceMetrics
	require.NoError(t, b.metrics.Collect(context.Background(), &rm))
	jobs := map[string]int64{}
	calls := map[string]uint64{}
	lag := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if m.Name == "outbox_jobs" {
						kind, _ := p.Attributes.Value("kind")
						state, _ := p.Attributes.Value("state")
						jobs[kind.AsString()+" "+state.AsString()] += p.Value
					}
				}
			case metricdata.Gauge[float64]:
				lag = lag || m.Name == "outbox_oldest_available_job_age_seconds"
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if m.Name == "processor_call_duration_seconds" {
						op, _ := p.Attributes.Value("operation")
						outcome, _ := p.Attributes.Value("outcome")
						calls[op.AsString()+" "+outcome.AsString()] += p.Count
					}
				}
			}
		}
	}
	require.Equal(t, int64(2), jobs["charge_payment completed"], "%v", jobs)
	require.True(t, lag, "no lag gauge")
	require.Equal(t, map[string]uint64{"charge succeeded": 1, "charge declined": 1}, calls)
}
