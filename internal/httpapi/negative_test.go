package httpapi_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// The request side of the contract, generated from openapi.yaml rather than
// written case by case: for every operation with a JSON body, every
// property of its schema gets values the schema forbids (another type, null
// where it is not nullable, past a bound, outside an enum, against a
// pattern, a missing required field, an unknown one), and each must be a 400
// problem that stores nothing; and values the schema allows (its bounds, each
// enum value, null where nullable) must be accepted. A schema looser than the
// server fails the second half; a server looser than the schema, the first.
func TestRequestBodiesAgainstTheSpec(t *testing.T) {
	t.Parallel()
	doc, _, err := loadSpec()
	require.NoError(t, err)
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)

	tried := 0
	for _, path := range slices.Sorted(maps.Keys(doc.Paths.Map())) {
		op := doc.Paths.Value(path).Post
		if op == nil || op.RequestBody == nil {
			continue
		}
		media := op.RequestBody.Value.Content.Get("application/json")
		require.NotNil(t, media, "POST %s: a JSON body", path)
		schema := media.Schema.Value
		example := exampleOf(t, media)
		filled(t, b, k.Secret, example) // the resources it names, the test's own

		t.Run("refused "+path, func(t *testing.T) {
			// One target for the refused requests, which never reach it; a
			// new one for each accepted request (a refund takes room).
			refused := aimed(t, b, k.Secret, path)
			before := storedRows(t, b)
			for _, c := range refusedBodies(t, schema, example) {
				r := b.post(t, refused, k.Secret, "neg-"+randomSuffix(), c.body)
				requireProblem(t, r, http.StatusBadRequest, "validation-failed")
				require.NotEmpty(t, decode(t, r.Body)["errors"], "%s: %s", c.why, c.body)
				tried++
			}
			require.Equal(t, before, storedRows(t, b), "a refused request stored something")
		})
		t.Run("accepted "+path, func(t *testing.T) {
			for _, c := range acceptedBodies(t, schema, example) {
				r := b.post(t, aimed(t, b, k.Secret, path), k.Secret, "pos-"+randomSuffix(), c.body)
				require.Less(t, r.Status, 300, "%s: %s -> %s", c.why, c.body, r.Body)
				tried++
			}
		})
	}
	require.Greater(t, tried, 60, "the walk tried too little: is the spec loaded?")
}

// The Idempotency-Key header, against the parameter's pattern: every value
// the pattern refuses is a 400, every value it admits is served; and the
// header sent twice is a 400.
func TestIdempotencyKeyHeaderAgainstTheSpec(t *testing.T) {
	t.Parallel()
	doc, _, err := loadSpec()
	require.NoError(t, err)
	pattern := regexp.MustCompile(doc.Components.Parameters["IdempotencyKey"].Value.Schema.Value.Pattern)
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	before := storedRows(t, b)
	for _, key := range []string{`"`, `""`, `"abc`, `"a\x"`, `"a"b"`, strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`, "é"} {
		require.False(t, pattern.MatchString(key), "the pattern admits %q", key)
		r := b.post(t, "/v1/payments", k.Secret, key, `{"amount": 100, "currency": "usd"}`)
		require.Equal(t, http.StatusBadRequest, r.Status, "%q: %s", key, r.Body)
	}
	twice := b.do(t, call{method: http.MethodPost, path: "/v1/payments", secret: k.Secret, body: `{"amount": 100, "currency": "usd"}`,
		header: http.Header{"Idempotency-Key": {"first", "second"}}})
	requireProblem(t, twice, http.StatusBadRequest, "idempotency-key-invalid")
	require.Equal(t, before, storedRows(t, b), "a refused request stored something")

	for _, key := range []string{"k", `a"b`, "a b", strings.Repeat("k", 255), `"` + strings.Repeat("k", 255) + `"`, `"a\"b"`, `"a\\b"`} {
		require.True(t, pattern.MatchString(key), "the pattern refuses %q", key)
		r := b.post(t, "/v1/payments", k.Secret, key, `{"amount": 100, "currency": "usd"}`)
		require.Equal(t, http.StatusCreated, r.Status, "%q: %s", key, r.Body)
	}
}

// storedRows counts what a request could have stored.
func storedRows(t *testing.T, b *testBundle) string {
	t.Helper()
	var counts []string
	// Not events: the outbox records them as earlier payments settle. A
	// fork may have taken a table out (docs/fork.md).
	for _, table := range []string{"idempotency_keys", "payments", "refunds", "webhook_endpoints"} {
		if b.count(t, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = $1`, table) == 1 {
			counts = append(counts, fmt.Sprintf("%s=%d", table, b.count(t, "SELECT count(*) FROM "+table)))
		}
	}
	return strings.Join(counts, " ")
}

// exampleOf is the operation's first request example, as a JSON object.
func exampleOf(t *testing.T, media *openapi3.MediaType) map[string]any {
	t.Helper()
	var v any = media.Schema.Value.Example
	for _, name := range slices.Sorted(maps.Keys(media.Examples)) {
		if v == nil {
			v = media.Examples[name].Value.Value
		}
	}
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

// bodyCase is one generated request body and why it is what it is.
type bodyCase struct{ why, body string }

// with returns example with field set to v (or removed, for absent).
func with(t *testing.T, example map[string]any, field string, v any, absent bool) string {
	t.Helper()
	m := maps.Clone(example)
	if absent {
		delete(m, field)
	} else {
		m[field] = v
	}
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	return string(raw)
}

func refusedBodies(t *testing.T, s *openapi3.Schema, example map[string]any) []bodyCase {
	t.Helper()
	cases := []bodyCase{
		{"the body is null", "null"},
		{"the body is an array", "[]"},
		{"an unknown field", with(t, example, "no_such_field", 1, false)},
	}
	for _, name := range s.Required {
		cases = append(cases, bodyCase{name + " is required", with(t, example, name, nil, true)})
	}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		for _, v := range forbidden(s.Properties[name].Value) {
			cases = append(cases, bodyCase{name + ": " + v.why, with(t, example, name, v.value, false)})
		}
	}
	return cases
}

func acceptedBodies(t *testing.T, s *openapi3.Schema, example map[string]any) []bodyCase {
	t.Helper()
	cases := []bodyCase{{"the example", with(t, example, "", nil, true)}}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		for _, v := range allowed(s.Properties[name].Value) {
			cases = append(cases, bodyCase{name + ": " + v.why, with(t, example, name, v.value, false)})
		}
	}
	return cases
}

type value struct {
	why   string
	value any
}

// forbidden lists values that s does not admit.
func forbidden(s *openapi3.Schema) []value {
	var out []value
	if !s.Nullable {
		out = append(out, value{"null where not nullable", nil})
	}
	switch {
	case s.Type.Is("integer"):
		out = append(out, value{"a string", "1"}, value{"a fraction", 1.5},
			value{"beyond int64", json.RawMessage("9223372036854775808")})
		if s.Min != nil {
			out = append(out, value{"below the minimum", int64(*s.Min) - 1})
		}
		if s.Max != nil {
			out = append(out, value{"above the maximum", int64(*s.Max) + 1})
		}
	case s.Type.Is("string"):
		out = append(out, value{"a number", 1})
		if s.MaxLength != nil {
			out = append(out, value{"longer than maxLength", strings.Repeat("a", int(*s.MaxLength)+1)})
		}
		if len(s.Enum) > 0 {
			out = append(out, value{"outside the enum", "not-in-the-enum"}, value{"mixed case", "uSd"})
		}
		if s.Pattern != "" {
			for _, v := range []string{"with\x00nul", "", "a"} {
				if !regexp.MustCompile(s.Pattern).MatchString(v) {
					out = append(out, value{fmt.Sprintf("%q against the pattern", v), v})
				}
			}
		}
	case s.Type.Is("object"):
		out = append(out, value{"a string", "x"})
		if s.MaxProps != nil {
			m := map[string]any{}
			for i := range int(*s.MaxProps) + 1 {
				m[fmt.Sprintf("k%d", i)] = "v"
			}
			out = append(out, value{"more than maxProperties", m})
		}
		if ap := s.AdditionalProperties.Schema; ap != nil {
			for _, v := range forbidden(ap.Value) {
				out = append(out, value{"a value " + v.why, map[string]any{"k": v.value}})
			}
		}
	}
	return out
}

// allowed lists values that s admits: its bounds, its enum (sampled when
// long), null where nullable, and the longest string where a string of
// that length fits its pattern.
func allowed(s *openapi3.Schema) []value {
	var out []value
	if s.Nullable {
		out = append(out, value{"null where nullable", nil})
	}
	switch {
	case s.Type.Is("integer"):
		if s.Min != nil {
			out = append(out, value{"the minimum", int64(*s.Min)})
		}
		if s.Max != nil {
			out = append(out, value{"the maximum", int64(*s.Max)})
		}
	case s.Type.Is("string"):
		for i, e := range s.Enum {
			if e != nil && (len(s.Enum) <= 10 || i%25 == 0 || i == len(s.Enum)-1) {
				out = append(out, value{fmt.Sprintf("enum value %v", e), e})
			}
		}
		if s.MaxLength != nil && len(s.Enum) == 0 {
			long := strings.Repeat("é", int(*s.MaxLength))
			if s.Pattern == "" || regexp.MustCompile(s.Pattern).MatchString(long) {
				out = append(out, value{"maxLength characters", long})
			}
		}
	case s.Type.Is("object"):
		if s.MaxProps != nil {
			m := map[string]any{}
			for i := range int(*s.MaxProps) {
				m[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 10)
			}
			out = append(out, value{"maxProperties entries", m})
		}
	}
	return out
}
