package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"

	idempotentpayments "github.com/payments-reference/idempotent-payments"
)

// The contract check: every response any test in this package receives
// through testBundle.do is validated against openapi.yaml, status codes
// included. A response the spec does not describe fails the test that got it.

var (
	specOnce   sync.Once
	specDoc    *openapi3.T
	specRouter routers.Router
	specErr    error
)

func loadSpec() (*openapi3.T, routers.Router, error) {
	specOnce.Do(func() {
		openapi3filter.RegisterBodyDecoder("application/problem+json", openapi3filter.JSONBodyDecoder)
		doc, err := openapi3.NewLoader().LoadFromData(idempotentpayments.OpenAPI)
		if err != nil {
			specErr = fmt.Errorf("load openapi.yaml: %w", err)
			return
		}
		if err := doc.Validate(context.Background()); err != nil {
			specErr = fmt.Errorf("openapi.yaml is invalid: %w", err)
			return
		}
		// Match any host: the tests' servers listen on random ports.
		doc.Servers = openapi3.Servers{{URL: "/"}}
		specDoc = doc
		specRouter, specErr = gorillamux.NewRouter(doc)
	})
	return specDoc, specRouter, specErr
}

// checkContract validates one exchange against the spec.
func checkContract(t *testing.T, req *http.Request, r response) {
	t.Helper()
	_, router, err := loadSpec()
	require.NoError(t, err)
	route, params, err := router.FindRoute(req)
	require.NoError(t, err, "%s %s is not in openapi.yaml", req.Method, req.URL.Path)
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 r.Status,
		Header:                 r.Header,
		Body:                   io.NopCloser(bytes.NewReader(r.Body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	require.NoError(t, openapi3filter.ValidateResponse(context.Background(), in),
		"%s %s -> %d does not match openapi.yaml; body: %s", req.Method, req.URL.Path, r.Status, r.Body)
	if len(r.Body) == 0 {
		return
	}
	resp := route.Operation.Responses.Status(r.Status)
	if resp == nil {
		resp = route.Operation.Responses.Default()
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if content := resp.Value.Content.Get(mt); content != nil && content.Schema != nil {
		doc, _, _ := loadSpec()
		require.NoError(t, strictValidate(doc, content.Schema, r.Body),
			"%s %s -> %d does not match openapi.yaml read strictly (OpenAPI 3.0.3: nullable does not extend an enum); body: %s",
			req.Method, req.URL.Path, r.Status, r.Body)
	}
}

func TestSpecIsValid(t *testing.T) {
	t.Parallel()
	doc, _, err := loadSpec()
	require.NoError(t, err)
	window := doc.Extensions["x-idempotency"].(map[string]any)["window"]
	require.Equal(t, "PT24H", window, "the published retry window")
}

// Every route the router serves is in the spec, and every path and method in
// the spec is served.
func TestSpecAndRouterAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var served []string
	err := chi.Walk(b.handler.(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if route != "/" {
			route = strings.TrimSuffix(route, "/")
		}
		served = append(served, method+" "+strings.ReplaceAll(route, "/*", ""))
		return nil
	})
	require.NoError(t, err)
	doc, _, err := loadSpec()
	require.NoError(t, err)
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	slices.Sort(served)
	slices.Sort(documented)
	require.Equal(t, documented, served)
}

func TestServesTheSpecAndItsReferencePage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := b.get(t, "/openapi.yaml", "")
	require.Equal(t, http.StatusOK, spec.Status)
	require.Equal(t, idempotentpayments.OpenAPI, spec.Body)

	page := b.get(t, "/docs", "")
	require.Equal(t, http.StatusOK, page.Status)
	require.Contains(t, string(page.Body), `spec-url="/openapi.yaml"`)
	require.Contains(t, string(page.Body), `src="/docs/redoc.standalone.js"`)
	require.NotContains(t, string(page.Body), "cdn", "no CDN at run time")

	script := b.get(t, "/docs/redoc.standalone.js", "")
	require.Equal(t, http.StatusOK, script.Status)
	require.Greater(t, len(script.Body), 100_000)
}

// servedRoutes maps each route the router serves (with {id} as in the spec)
// to its methods.
func servedRoutes(t *testing.T, h http.Handler) map[string][]string {
	t.Helper()
	routes := map[string][]string{}
	err := chi.Walk(h.(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if route != "/" {
			route = strings.TrimSuffix(route, "/")
		}
		route = strings.ReplaceAll(route, "/*", "")
		routes[route] = append(routes[route], method)
		return nil
	})
	require.NoError(t, err)
	return routes
}

// HEAD of every GET route answers like GET (the same status and headers,
// no body), instead of 405; and every 405 says in Allow what the resource
// does allow (RFC 9110, 15.5.6).
func TestHeadAnswersLikeGetAndEvery405SaysWhatIsAllowed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.newKey(t, "acme", allScopes...)
	pay := b.createPayment(t, k.Secret, 1000)
	// A refund only if the router serves refunds (a fork may not).
	refund := sync.OnceValue(func() string {
		r := b.post(t, "/v1/payments/"+pay+"/refunds", k.Secret, "refund", `{"amount": 100}`)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		return decode(t, r.Body)["id"].(string)
	})
	concrete := func(route string) string {
		if strings.HasPrefix(route, "/v1/refunds/") {
			return strings.ReplaceAll(route, "{id}", refund())
		}
		return strings.ReplaceAll(route, "{id}", pay)
	}

	routes := servedRoutes(t, b.handler)
	gets := 0
	for route, methods := range routes {
		path := concrete(route)
		if slices.Contains(methods, http.MethodGet) {
			gets++
			for _, p := range []string{path, path + "?limit=1"} {
				get := b.do(t, call{method: http.MethodGet, path: p, secret: k.Secret, offSpec: true})
				head := b.do(t, call{method: http.MethodHead, path: p, secret: k.Secret, offSpec: true})
				require.Equal(t, get.Status, head.Status, "HEAD %s", p)
				require.Equal(t, get.Header.Get("Content-Type"), head.Header.Get("Content-Type"), "HEAD %s", p)
				require.Empty(t, head.Body, "HEAD %s", p)
			}
		}
		want := slices.Clone(methods)
		if slices.Contains(want, http.MethodGet) {
			want = append(want, http.MethodHead)
		}
		slices.Sort(want)
		for _, m := range []string{http.MethodDelete, http.MethodPut, http.MethodPatch, http.MethodPost} {
			if slices.Contains(methods, m) {
				continue
			}
			got := b.do(t, call{method: m, path: path, secret: k.Secret, offSpec: true})
			require.Equal(t, http.StatusMethodNotAllowed, got.Status, "%s %s", m, path)
			allow := strings.Split(got.Header.Get("Allow"), ", ")
			slices.Sort(allow)
			require.Equal(t, want, allow, "Allow of %s", path)
		}
	}
	require.GreaterOrEqual(t, gets, 8, "every GET route was tried: %v", routes)
}
