package httpapi_test

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// The examples in openapi.yaml are what /docs shows and what readers copy.
// Redoc makes up a sample from a schema that has none (a currency of
// "^AAA$" from the pattern), so every schema, parameter, request body and
// problem response carries a real one, and these tests keep them true.

// exampleOptions validate formats as well: an id that is not a UUID or a
// timestamp that is not RFC 3339 is a wrong example, though the spec's
// validator would let it through.
var exampleOptions = []openapi3.SchemaValidationOption{
	openapi3.EnableFormatValidation(),
	openapi3.WithStringFormatValidator("uuid", openapi3.NewRegexpFormatValidator(openapi3.FormatOfStringForUUIDOfRFC9562)),
	openapi3.MultiErrors(),
}

// mediaExamples returns a media type's examples by name ("" for the single
// example), and whether it has any, its schema's own example included.
func mediaExamples(mt *openapi3.MediaType) (map[string]any, bool) {
	out := map[string]any{}
	if mt.Example != nil {
		out[""] = mt.Example
	}
	for name, ex := range mt.Examples {
		out[name] = ex.Value.Value
	}
	has := len(out) > 0 || (mt.Schema != nil && mt.Schema.Value.Example != nil)
	return out, has
}

func TestEveryExampleValidates(t *testing.T) {
	t.Parallel()
	doc, _, err := loadSpec()
	require.NoError(t, err)

	for name, s := range doc.Components.Schemas {
		require.NotNil(t, s.Value.Example, "schema %s has no example", name)
		require.NoError(t, s.Value.VisitJSON(s.Value.Example, exampleOptions...), "schema %s's example", name)
	}
	checkParam := func(where string, p *openapi3.Parameter) {
		require.NotNil(t, p.Example, "%s: parameter %s has no example", where, p.Name)
		require.NoError(t, p.Schema.Value.VisitJSON(p.Example, exampleOptions...), "%s: parameter %s's example", where, p.Name)
	}
	for _, p := range doc.Components.Parameters {
		checkParam("components", p.Value)
	}
	checkContent := func(where string, content openapi3.Content, status int) {
		for ct, mt := range content {
			if ct != "application/json" && ct != "application/problem+json" {
				continue
			}
			examples, has := mediaExamples(mt)
			require.True(t, has, "%s %s has no example", where, ct)
			for name, ex := range examples {
				require.NoError(t, mt.Schema.Value.VisitJSON(ex, exampleOptions...), "%s %s example %q", where, ct, name)
				if ct == "application/problem+json" && status != 0 {
					require.EqualValues(t, status, ex.(map[string]any)["status"], "%s example %q: its status", where, name)
				}
			}
		}
	}
	for name, r := range doc.Components.Responses {
		checkContent("response "+name, r.Value.Content, 0)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			for _, p := range op.Parameters {
				checkParam(where, p.Value)
			}
			if op.RequestBody != nil {
				mt := op.RequestBody.Value.Content.Get("application/json")
				require.NotNil(t, mt, where)
				require.NotEmpty(t, mt.Examples, "%s: the request body has no examples", where)
				checkContent(where+" request", op.RequestBody.Value.Content, 0)
			}
			for code, r := range op.Responses.Map() {
				status, err := strconv.Atoi(code)
				require.NoError(t, err)
				checkContent(where+" "+code, r.Value.Content, status)
			}
		}
	}
}

// newTarget makes, with secret, a resource of the test's own under a
// collection's path, for a request whose path names one ({id}): the spec's
// examples name ids the test does not have. Each feature's tests add their
// collections' (webhooks_test.go, in an init), so that a fork that takes a
// feature out takes its entries with it. A payment is made for the largest
// amount, so that any refund the schema allows fits in it.
var newTarget = map[string]func(t *testing.T, b *testBundle, secret string) string{
	"/v1/payments/": func(t *testing.T, b *testBundle, secret string) string {
		return b.createPayment(t, secret, payments.MaxAmount)
	},
}

// fillIn gives, for a request body's field that names a resource, one of
// the test's own, made with secret; registered as newTarget's entries are.
var fillIn = map[string]func(t *testing.T, b *testBundle, secret string) any{}

// aimed is path with its {id}, if it has one, naming a new resource of the
// test's (newTarget).
func aimed(t *testing.T, b *testBundle, secret, path string) string {
	t.Helper()
	if !strings.Contains(path, "{id}") {
		return path
	}
	for collection, make := range newTarget {
		if strings.HasPrefix(path, collection) {
			return strings.Replace(path, "{id}", make(t, b, secret), 1)
		}
	}
	t.Fatalf("%s: no resource of the test's for its {id}; add its collection to newTarget", path)
	return ""
}

// filled sets the fields of body that fillIn knows to resources of the
// test's own.
func filled(t *testing.T, b *testBundle, secret string, body map[string]any) {
	t.Helper()
	for field, fill := range fillIn {
		if _, ok := body[field]; ok {
			body[field] = fill(t, b, secret)
		}
	}
}

// success is the one 2xx status the spec gives op.
func success(t *testing.T, op *openapi3.Operation) int {
	t.Helper()
	var codes []int
	for code := range op.Responses.Map() {
		if n, err := strconv.Atoi(code); err == nil && n >= 200 && n < 300 {
			codes = append(codes, n)
		}
	}
	require.Len(t, codes, 1, "%s: one success status", op.OperationID)
	return codes[0]
}

// Every request example in openapi.yaml, sent to the running service with
// the resources it names made by the test (newTarget, fillIn), succeeds
// with the status the spec gives.
func TestRequestExamplesSucceed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := b.newKey(t, "acme", allScopes...).Secret
	doc, _, err := loadSpec()
	require.NoError(t, err)

	ran := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody == nil {
				continue
			}
			examples := op.RequestBody.Value.Content.Get("application/json").Examples
			require.NotEmpty(t, examples, "%s %s: a request example to run", method, path)
			names := make([]string, 0, len(examples))
			for name := range examples {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, name := range names {
				raw, err := json.Marshal(examples[name].Value.Value)
				require.NoError(t, err)
				var example map[string]any // a copy: the spec is shared between tests
				require.NoError(t, json.Unmarshal(raw, &example))
				filled(t, b, secret, example)
				body, err := json.Marshal(example)
				require.NoError(t, err)
				r := b.do(t, call{method: method, path: aimed(t, b, secret, path), secret: secret, key: "example-" + op.OperationID + "-" + name, body: string(body)})
				require.Equal(t, success(t, op), r.Status, "%s example %q: %s", op.OperationID, name, r.Body)
				ran++
			}
		}
	}
	require.Positive(t, ran, "the request examples of every operation with a body")
}
