package httpapi_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
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

// Every request example in openapi.yaml, sent as it stands to the running
// service, succeeds.
func TestRequestExamplesSucceed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := b.newKey(t, "acme", webhookScopes...).Secret
	doc, _, err := loadSpec()
	require.NoError(t, err)

	// An endpoint for the webhook operations' examples, and an event for
	// the resend's (the spec's names none of this test's).
	endpoint := b.registerEndpoint(t, secret, "http://127.0.0.1:9/")["id"].(string)
	b.createPayment(t, secret, 1000)
	event := b.listed(t, "/v1/events", secret, 1)["data"].([]any)[0].(map[string]any)["id"].(string)

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
				body, err := json.Marshal(examples[name].Value.Value)
				require.NoError(t, err)
				concrete := path
				status := http.StatusCreated
				switch op.OperationID {
				case "createPayment", "createWebhookEndpoint":
				case "updateWebhookEndpoint":
					concrete, status = strings.Replace(path, "{id}", endpoint, 1), http.StatusOK
				case "resendWebhookEvent":
					concrete, status = strings.Replace(path, "{id}", endpoint, 1), http.StatusAccepted
					body, err = json.Marshal(map[string]string{"event_id": event})
					require.NoError(t, err)
				case "recoverWebhookEvents":
					concrete, status = strings.Replace(path, "{id}", endpoint, 1), http.StatusAccepted
				case "createRefund":
					// A charged payment of its own per example, as the
					// examples' amounts assume.
					concrete = strings.Replace(path, "{id}", b.createPayment(t, secret, 2500), 1)
				default:
					t.Fatalf("%s %s: no way to run its request examples yet; add one here", method, path)
				}
				r := b.do(t, call{method: method, path: concrete, secret: secret, key: "example-" + op.OperationID + "-" + name, body: string(body)})
				require.Equal(t, status, r.Status, "%s example %q: %s", op.OperationID, name, r.Body)
				ran++
			}
		}
	}
	require.Positive(t, ran, "the request examples of every operation with a body")
}
