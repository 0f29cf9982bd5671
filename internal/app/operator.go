package app

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"

	"riverqueue.com/riverui"

	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/telemetry"
)

// operatorMux serves the operator's listener: /metrics, /debug/pprof/ when
// enabled, and River UI at /riverui/ when queues is not nil. It listens
// apart from the API so that none of them is ever exposed with it.
func operatorMux(tel *telemetry.Telemetry, withPprof bool, queues http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.MetricsHandler)
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if queues != nil {
		mux.Handle("/riverui/", queues)
	}
	return mux
}

// riverUI returns River UI over the outbox's jobs, behind the admin
// password, for as long as ctx lives. Job arguments are hidden in its lists
// until the operator shows them: they name tenants' payments and endpoints.
// River UI can cancel, retry and delete jobs; a charge job deleted by hand
// is found again by the reconciler (docs/reliability.md).
func riverUI(ctx context.Context, jobs *outbox.Client, password string, log *slog.Logger) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints:                riverui.NewEndpoints(jobs, nil),
		JobListHideArgsByDefault: true,
		Logger:                   log,
		Prefix:                   "/riverui",
	})
	if err != nil {
		return nil, fmt.Errorf("river ui: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, fmt.Errorf("start river ui: %w", err)
	}
	// A browser sends basic auth with every request to the listener, so a
	// page on another site could make it cancel or delete jobs: requests
	// that change something must come from River UI's own pages.
	return adminOnly(password, http.NewCrossOriginProtection().Handler(h)), nil
}

// adminOnly lets through the requests that carry user admin and password in
// HTTP basic auth. Both sides are hashed before the comparison, so that its
// time says nothing about the password, not even its length.
func adminOnly(password string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte("admin:" + password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, _ := r.BasicAuth()
		got := sha256.Sum256([]byte(user + ":" + pass))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="operator", charset="UTF-8"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
