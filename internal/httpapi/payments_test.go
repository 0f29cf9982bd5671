package httpapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

const paymentBody = `{"amount": 1000, "currency": "usd", "description": "order 42", "metadata": {"order": "42"}}`

func TestCreatePayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)

	r := b.post(t, "/v1/payments", k.Secret, "create-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	require.NotEmpty(t, r.Header.Get("X-Request-Id"))
	require.Empty(t, r.Header.Get("Idempotent-Replayed"))
	p := decode(t, r.Body)
	require.EqualValues(t, 1000, p["amount"])
	require.Equal(t, "usd", p["currency"])
	require.Equal(t, "processing", p["status"])
	require.Equal(t, "order 42", p["description"])
	require.Equal(t, map[string]any{"order": "42"}, p["metadata"])
	require.NotEmpty(t, p["created_at"])

	got := b.get(t, "/v1/payments/"+p["id"].(string), k.Secret)
	require.Equal(t, http.StatusOK, got.Status, "body: %s", got.Body)
	require.Equal(t, p["id"], decode(t, got.Body)["id"])

	// The stored record: scoped by the route template, fingerprint and
	// response stored, the request body itself nowhere.
	var endpoint, state, correlation string
	var fingerprint, stored []byte
	require.NoError(t, b.admin.QueryRow(context.Background(),
		`SELECT endpoint, state, fingerprint, response_body, correlation_id FROM idempotency_keys WHERE key = 'create-1'`).
		Scan(&endpoint, &state, &fingerprint, &stored, &correlation))
	require.Equal(t, "POST /v1/payments", endpoint)
	require.Equal(t, "completed", state)
	require.Len(t, fingerprint, 32)
	require.Equal(t, r.Body, stored)
	require.Equal(t, r.Header.Get("X-Request-Id"), correlation)
}

func TestReplayReturnsTheSameBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)

	first := b.post(t, "/v1/payments", k.Secret, "replay-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.Status)
	second := b.post(t, "/v1/payments", k.Secret, "replay-1", paymentBody)

	require.Equal(t, first.Status, second.Status)
	require.Equal(t, first.Header.Get("Content-Type"), second.Header.Get("Content-Type"))
	require.Equal(t, first.Body, second.Body)
	require.Equal(t, "true", second.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Header.Get("X-Request-Id"), second.Header.Get("X-Original-Request-Id"))
	require.NotEqual(t, first.Header.Get("X-Request-Id"), second.Header.Get("X-Request-Id"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
}

func TestConcurrentRequestsWithOneKeyExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 8 })
	k := b.newKey(t, "acme", allScopes...)

	const n = 50
	responses := make([]response, n)
	concurrently(n, func(i int) {
		responses[i] = b.post(t, "/v1/payments", k.Secret, "same-key", paymentBody)
	})

	replayed := 0
	for _, r := range responses {
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		require.Equal(t, responses[0].Body, r.Body)
		if r.Header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	require.Equal(t, n-1, replayed)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}

func TestPrincipalsDoNotShareKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := b.newKey(t, "acme", allScopes...)
	globex := b.newKey(t, "globex", allScopes...)

	a := b.post(t, "/v1/payments", acme.Secret, "shared-key", paymentBody)
	g := b.post(t, "/v1/payments", globex.Secret, "shared-key", paymentBody)
	require.Equal(t, http.StatusCreated, a.Status)
	require.Equal(t, http.StatusCreated, g.Status)
	require.Empty(t, g.Header.Get("Idempotent-Replayed"))
	require.NotEqual(t, decode(t, a.Body)["id"], decode(t, g.Body)["id"])
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments`))

	// Neither can read the other's payment.
	require.Equal(t, http.StatusNotFound, b.get(t, "/v1/payments/"+decode(t, a.Body)["id"].(string), globex.Secret).Status)
	require.Equal(t, http.StatusNotFound, b.get(t, "/v1/payments/"+decode(t, g.Body)["id"].(string), acme.Secret).Status)
}

func TestKeysAreSharedByAPrincipalsKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.newKey(t, "acme", allScopes...)
	second := b.newKey(t, "acme", allScopes...)

	a := b.post(t, "/v1/payments", first.Secret, "k", paymentBody)
	r := b.post(t, "/v1/payments", second.Secret, "k", paymentBody)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, a.Body, r.Body)
}

func TestKeyReusedForADifferentRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)

	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "k", paymentBody).Status)
	r := b.post(t, "/v1/payments", k.Secret, "k", `{"amount": 2000, "currency": "usd"}`)
	requireProblem(t, r, http.StatusUnprocessableEntity, "idempotency-key-reused")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))

	// As openapi.yaml's outcomes table says: the 422 stored nothing, but the
	// key stays bound to its first request. That one still replays; the
	// second request gets 422 again, however often it is sent.
	requireProblem(t, b.post(t, "/v1/payments", k.Secret, "k", `{"amount": 2000, "currency": "usd"}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
	require.Equal(t, "true", b.post(t, "/v1/payments", k.Secret, "k", paymentBody).Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
}

func TestReformattedJSONIsTheSameRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)

	first := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	require.Equal(t, http.StatusCreated, first.Status)
	reordered := "{\n  \"metadata\" : { \"order\" : \"42\" },\n\t\"currency\":\"usd\",  \"description\": \"order \\u0034\\u0032\",\"amount\":1000\n}\n"
	r := b.post(t, "/v1/payments", k.Secret, "k", reordered)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Body, r.Body)
}

func TestValidationFailureDoesNotConsumeTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)

	requireProblem(t, b.post(t, "/v1/payments", k.Secret, "k", `{"amount": 0, "currency": "usd"}`), http.StatusBadRequest, "validation-failed")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idempotency_keys`))

	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"))
}

// A failure after the claim (here, injected with a trigger) rolls back the
// claim and the payment together; the retry then executes cleanly.
func TestFailureAfterClaimLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, table, when string
	}{
		{"business write fails", "payments", "BEFORE INSERT"},
		{"storing the response fails", "idempotency_keys", "BEFORE UPDATE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			k := b.newKey(t, "acme", allScopes...)
			ctx := context.Background()
			_, err := b.admin.Exec(ctx, `
				CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;
				CREATE TRIGGER inject_failure `+tc.when+` ON `+tc.table+` FOR EACH ROW EXECUTE FUNCTION fail();`)
			require.NoError(t, err)

			requireProblem(t, b.post(t, "/v1/payments", k.Secret, "k", paymentBody), http.StatusInternalServerError, "internal-error")
			require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idempotency_keys`))
			require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments`))
			require.Equal(t, 0, b.jobs(t, `true`), "no charge job for a payment that rolled back")

			_, err = b.admin.Exec(ctx, `DROP TRIGGER inject_failure ON `+tc.table)
			require.NoError(t, err)
			r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
			require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
			require.Empty(t, r.Header.Get("Idempotent-Replayed"))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
		})
	}
}

func TestReplayIsReauthorized(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writer := b.newKey(t, "acme", allScopes...)
	reader := b.newKey(t, "acme", "payments:read")
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", writer.Secret, "k", paymentBody).Status)

	requireProblem(t, b.post(t, "/v1/payments", reader.Secret, "k", paymentBody), http.StatusForbidden, "forbidden")

	_, err := b.admin.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, writer.ID)
	require.NoError(t, err)
	r := b.post(t, "/v1/payments", writer.Secret, "k", paymentBody)
	requireProblem(t, r, http.StatusUnauthorized, "unauthenticated")
	require.Equal(t, `Bearer realm="payments"`, r.Header.Get("WWW-Authenticate"))
	require.NotContains(t, string(r.Body), "succeeded")
}

// Another attempt holds the key (its transaction has claimed and not ended):
// past the lock timeout the request gets 409 with Retry-After, and once the
// holder rolls back the key is free again.
func TestInProgressKeyTimesOutWith409(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.lockTimeout = 200 * time.Millisecond })
	k := b.newKey(t, "acme", allScopes...)
	ctx := context.Background()

	holder, err := pgx.Connect(ctx, b.db.AppURL)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT set_config('app.principal_id', $1, true)`, k.PrincipalID.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, correlation_id, expires_at)
		VALUES ($1, 'POST /v1/payments', 'k', 'in_progress', sha256(''), 'req_holder', now() + interval '1 day')`, k.PrincipalID)
	require.NoError(t, err)

	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	requireProblem(t, r, http.StatusConflict, "idempotency-request-in-progress")
	require.Equal(t, "1", r.Header.Get("Retry-After"))

	require.NoError(t, tx.Rollback(ctx))
	r = b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
}

func TestNoFreeConnectionIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxConns = 1; o.acquireTimeout = 200 * time.Millisecond })
	k := b.newKey(t, "acme", allScopes...)
	ctx := context.Background()

	held, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	r := b.post(t, "/v1/payments", k.Secret, "k", paymentBody)
	requireProblem(t, r, http.StatusServiceUnavailable, "service-unavailable")
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	held.Release()

	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, "k", paymentBody).Status)
}

func TestDatabaseDownIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) {
		// Nothing listens on port 1: every connection attempt is refused.
		o.databaseURL = "postgres://payments_app@127.0.0.1:1/payments?sslmode=disable&connect_timeout=1"
		o.acquireTimeout = time.Second
	})
	start := time.Now()
	r := b.post(t, "/v1/payments", "sk_whatever", "k", paymentBody)
	requireProblem(t, r, http.StatusServiceUnavailable, "service-unavailable")
	require.Contains(t, decode(t, r.Body)["detail"], "same Idempotency-Key")
	// A read has no key to reuse: its 503 does not speak of one.
	ready := b.get(t, "/readyz", "")
	requireProblem(t, ready, http.StatusServiceUnavailable, "service-unavailable")
	require.NotContains(t, decode(t, ready.Body)["detail"], "Idempotency-Key")
	require.Equal(t, http.StatusOK, b.get(t, "/healthz", "").Status)
	// Not a timing assertion on performance: a hang would take the whole request timeout.
	require.Less(t, time.Since(start), 20*time.Second)
}

func TestBadRequestsAreProblemsAndStoreNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.maxBodyBytes = 4096 })
	k := b.newKey(t, "acme", allScopes...)
	reader := b.newKey(t, "acme", "payments:read")
	other := b.newKey(t, "globex", allScopes...)
	otherPayment := decode(t, b.post(t, "/v1/payments", other.Secret, "theirs", paymentBody).Body)["id"].(string)
	baseline := b.count(t, `SELECT count(*) FROM idempotency_keys`)

	post := func(key, body string) call {
		return call{method: http.MethodPost, path: "/v1/payments", secret: k.Secret, key: key, body: body}
	}
	for _, tc := range []struct {
		name   string
		call   call
		status int
		slug   string
	}{
		{"missing key", post("", paymentBody), 400, "idempotency-key-missing"},
		{"key too long", post(strings.Repeat("k", 256), paymentBody), 400, "idempotency-key-invalid"},
		{"key not ascii", post("ключ", paymentBody), 400, "idempotency-key-invalid"},
		{"not json", post("k1", `{"amount": 1000,`), 400, "invalid-json"},
		{"two json values", post("k2", `{} {}`), 400, "invalid-json"},
		{"unknown field", post("k3", `{"amount": 1000, "currency": "usd", "colour": "red"}`), 400, "validation-failed"},
		{"amount missing", post("k4", `{"currency": "usd"}`), 400, "validation-failed"},
		{"amount zero", post("k5", `{"amount": 0, "currency": "usd"}`), 400, "validation-failed"},
		{"amount negative", post("k6", `{"amount": -5, "currency": "usd"}`), 400, "validation-failed"},
		{"amount fractional", post("k7", `{"amount": 10.5, "currency": "usd"}`), 400, "validation-failed"},
		{"amount overflows int64", post("k8", `{"amount": 9223372036854775808, "currency": "usd"}`), 400, "validation-failed"},
		{"amount a string", post("k9", `{"amount": "1000", "currency": "usd"}`), 400, "validation-failed"},
		{"currency unknown", post("k10", `{"amount": 1000, "currency": "xyz"}`), 400, "validation-failed"},
		{"currency too long", post("k11", `{"amount": 1000, "currency": "usdd"}`), 400, "validation-failed"},
		{"description too long", post("k12", `{"amount": 1000, "currency": "usd", "description": "`+strings.Repeat("d", 1001)+`"}`), 400, "validation-failed"},
		{"metadata not strings", post("k13", `{"amount": 1000, "currency": "usd", "metadata": {"a": 1}}`), 400, "validation-failed"},
		// PostgreSQL text and jsonb cannot hold U+0000: refused here, not a 500 from the database.
		{"NUL in description", post("k19", `{"amount": 1000, "currency": "usd", "description": "a\u0000b"}`), 400, "validation-failed"},
		{"NUL in a metadata value", post("k20", `{"amount": 1000, "currency": "usd", "metadata": {"a": "\u0000"}}`), 400, "validation-failed"},
		{"NUL in a metadata key", post("k21", `{"amount": 1000, "currency": "usd", "metadata": {"a\u0000": "b"}}`), 400, "validation-failed"},
		{"body too large", post("k14", `{"amount": 1000, "currency": "usd", "description": "`+strings.Repeat("d", 5000)+`"}`), 413, "payload-too-large"},
		{"wrong content type", call{method: "POST", path: "/v1/payments", secret: k.Secret, key: "k15", body: paymentBody, contentType: "text/plain"}, 415, "unsupported-media-type"},
		{"no credentials", call{method: "POST", path: "/v1/payments", key: "k16", body: paymentBody}, 401, "unauthenticated"},
		{"unknown secret", call{method: "POST", path: "/v1/payments", secret: "sk_nope", key: "k17", body: paymentBody}, 401, "unauthenticated"},
		{"missing scope", call{method: "POST", path: "/v1/payments", secret: reader.Secret, key: "k18", body: paymentBody}, 403, "forbidden"},
		{"unknown payment", call{method: "GET", path: "/v1/payments/01a237a6-1ce6-7a98-be43-37d8ff4b5115", secret: k.Secret}, 404, "not-found"},
		{"another principal's payment", call{method: "GET", path: "/v1/payments/" + otherPayment, secret: k.Secret}, 404, "not-found"},
		{"malformed payment id", call{method: "GET", path: "/v1/payments/not-a-uuid", secret: k.Secret}, 404, "not-found"},
		{"unknown route", call{method: "GET", path: "/v1/nothing", secret: k.Secret, offSpec: true}, 404, "not-found"},
		{"method not allowed", call{method: "DELETE", path: "/v1/payments/" + otherPayment, secret: k.Secret, offSpec: true}, 405, "method-not-allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireProblem(t, b.do(t, tc.call), tc.status, tc.slug)
		})
	}
	require.Equal(t, baseline, b.count(t, `SELECT count(*) FROM idempotency_keys`), "a rejected request stored a key")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`), "a rejected request created a payment")
}

func TestKeyLengthLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	longest := strings.Repeat("k", 255)
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", k.Secret, longest, paymentBody).Status)
	require.Equal(t, "true", b.post(t, "/v1/payments", k.Secret, longest, paymentBody).Header.Get("Idempotent-Replayed"))
	requireProblem(t, b.post(t, "/v1/payments", k.Secret, longest+"k", paymentBody), 400, "idempotency-key-invalid")
}

func TestLogsHoldNoSecrets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	const key = "idem-key-that-must-not-be-logged"
	const description = "description-that-must-not-be-logged"
	body := fmt.Sprintf(`{"amount": 1000, "currency": "usd", "description": %q}`, description)
	created := b.post(t, "/v1/payments", k.Secret, key, body)
	require.Equal(t, http.StatusCreated, created.Status)
	b.post(t, "/v1/payments", k.Secret, key, body)
	b.post(t, "/v1/payments", k.Secret, key, `{"amount": 1, "currency": "usd"}`)
	b.post(t, "/v1/payments", "sk_wrong-secret-that-must-not-be-logged", key, body)

	logs := b.logs.String()
	require.Contains(t, logs, created.Header.Get("X-Request-Id"), "the test must see the access log")
	secretHash := sha256.Sum256([]byte(k.Secret))
	for _, secret := range []string{k.Secret, key, description, "sk_wrong-secret", decode(t, created.Body)["id"].(string),
		hex.EncodeToString(secretHash[:]), base64.StdEncoding.EncodeToString(secretHash[:])} {
		require.NotContains(t, logs, secret)
	}
}

// The fingerprint distinguishes exactly what the handler distinguishes: a
// member name twice or in another case is refused (400) before the key is
// claimed, so one key can neither replay a different intent nor refuse the
// same one.
func TestMemberNamesAreExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	for i, body := range []string{
		`{"amount": 1, "Amount": 1000, "currency": "usd"}`,
		`{"Amount": 1000, "amount": 1, "currency": "usd"}`,
		`{"AMOUNT": 7, "currency": "usd"}`,
		`{"amount": 7, "amount": 8, "currency": "usd"}`,
		`{"amount": 7, "currency": "usd", "metadata": {"a": "1", "a": "2"}}`,
	} {
		r := b.post(t, "/v1/payments", k.Secret, "k"+itoa(i), body)
		requireProblem(t, r, http.StatusBadRequest, "validation-failed")
	}
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM payments`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idempotency_keys`))

	// Nested objects and arrays of the same names are fine; metadata keys
	// are the client's own and case-sensitive.
	r := b.post(t, "/v1/payments", k.Secret, "ok", `{"amount": 7, "currency": "usd", "metadata": {"amount": "1", "Amount": "2"}}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
}

// GET /v1/payments pages through the caller's payments, oldest first, with
// a cursor: every payment once, none of another principal's.
func TestListPaymentsWithACursor(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers = true })
	k := b.newKey(t, "acme", allScopes...)
	other := b.newKey(t, "globex", allScopes...)
	var made []string
	for i := range 5 {
		r := b.post(t, "/v1/payments", k.Secret, "list-"+itoa(i), paymentBody)
		require.Equal(t, http.StatusCreated, r.Status)
		made = append(made, decode(t, r.Body)["id"].(string))
	}
	require.Equal(t, http.StatusCreated, b.post(t, "/v1/payments", other.Secret, "list-0", paymentBody).Status)
	b.listed(t, "/v1/payments?limit=100", k.Secret, len(made))

	// A client follows the cursor, and at the end of the list polls again
	// from its last cursor: the list ends where the list horizon is, which
	// a transaction of another database that has just ended can hold back
	// for a statement (migration 17), so the end can come before the
	// newest payments and move on a moment later.
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 50, "the pages never ended")
		path := "/v1/payments?limit=2"
		if cursor != "" {
			path += "&starting_after=" + cursor
		}
		r := b.get(t, path, k.Secret)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		page := decode(t, r.Body)
		data := page["data"].([]any)
		require.LessOrEqual(t, len(data), 2)
		for _, p := range data {
			seen = append(seen, p.(map[string]any)["id"].(string))
		}
		if len(seen) > 0 {
			cursor = seen[len(seen)-1]
		}
		if page["has_more"] == true {
			require.Len(t, data, 2, "a page that says more follow is full")
		} else {
			if len(seen) >= len(made) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	require.Equal(t, made, seen, "every payment once, oldest first, only the caller's")
	// has_more says that a page is not the last: a page of 4 of the 5 says
	// so, asked until the list's end is not held back (above).
	more := false
	for try := 0; try < 100 && !more; try++ {
		page := decode(t, b.get(t, "/v1/payments?limit=4", k.Secret).Body)
		more = page["has_more"] == true && len(page["data"].([]any)) == 4
		if !more {
			time.Sleep(20 * time.Millisecond)
		}
	}
	require.True(t, more, "a page of 4 of 5 payments says that more follow")

	for _, bad := range []string{"?limit=0", "?limit=101", "?limit=x", "?starting_after=nope", "?starting_after=" + uuid.NewString()} {
		requireProblem(t, b.get(t, "/v1/payments"+bad, k.Secret), http.StatusBadRequest, "validation-failed")
	}
}

// Every spelling the router accepts for one request is one request: a retry
// to /v1/payments/, or with the key quoted as the IETF draft's sf-string,
// replays instead of getting 422 "use a new key" (which would pay twice).
// A path id in upper case: TestEverySpellingOfARefundRetryIsTheSameRequest.
func TestEverySpellingOfARetryIsTheSameRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	first := b.post(t, "/v1/payments", k.Secret, "order-7", paymentBody)
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	for _, c := range []call{
		{method: http.MethodPost, path: "/v1/payments/", key: "order-7", offSpec: true},
		{method: http.MethodPost, path: "/v1/payments", key: `"order-7"`},
	} {
		c.secret, c.body = k.Secret, paymentBody
		again := b.do(t, c)
		require.Equal(t, http.StatusCreated, again.Status, "%s %q: %s", c.path, c.key, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "%s %q", c.path, c.key)
		require.Equal(t, first.Body, again.Body)
	}

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM payments`))
	// A quoted key and its bare form are one row.
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}
