package httpapi

import (
	"embed"
	"net/http"

	"github.com/go-chi/chi/v5"

	idempotentpayments "github.com/payments-reference/idempotent-payments"
)

//go:embed assets/docs.html assets/redoc.standalone.js
var assets embed.FS

// staticFile serves one embedded file. Everything is in the binary: the docs
// page works without a CDN or files on disk.
func staticFile(body []byte, contentType string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Cache-Control", "public, max-age=300")
		_, _ = w.Write(body)
	}
}

func mustAsset(name string) []byte {
	b, err := assets.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time; missing means a broken build
	}
	return b
}

// mountDocs serves the contract and its reference page.
func mountDocs(r chi.Router) {
	r.Get("/openapi.yaml", staticFile(idempotentpayments.OpenAPI, "application/yaml"))
	r.Get("/docs", staticFile(mustAsset("assets/docs.html"), "text/html; charset=utf-8"))
	r.Get("/docs/redoc.standalone.js", staticFile(mustAsset("assets/redoc.standalone.js"), "text/javascript; charset=utf-8"))
}
