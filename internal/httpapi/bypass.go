//go:build benchmark

package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// BenchmarkBypassAvailable reports whether this build can mount the
// benchmark bypass: only a binary built with -tags benchmark can (the load
// test builds one). A production build has no code that pays without a key.
const BenchmarkBypassAvailable = true

func (a *api) mountBenchmarkBypass(r chi.Router) {
	r.With(authenticate(a.pool, a.log), requireScope(auth.ScopePaymentsWrite, a.log)).
		Post("/benchmark/payments-without-idempotency", a.createPaymentWithoutIdempotency)
}

// createPaymentWithoutIdempotency is createPayment minus the key: the
// baseline the load test compares against (Deps.BenchmarkBypass).
func (a *api) createPaymentWithoutIdempotency(w http.ResponseWriter, r *http.Request) {
	var in payments.NewPayment
	if _, err := decodeJSON(w, r, a.maxBodyBytes, &in); err != nil {
		writeError(w, r, a.log, err)
		return
	}
	if err := in.Validate(); err != nil {
		writeError(w, r, a.log, err)
		return
	}
	p, _ := auth.FromContext(r.Context())
	var resp idempotency.Response
	err := database.InTenantTx(r.Context(), a.pool, p.ID, database.TxOptions{}, func(tx pgx.Tx) error {
		pay, err := payments.Create(r.Context(), tx, a.outbox, p.ID, in, a.livemode)
		if err != nil {
			return err
		}
		resp, err = renderJSON(http.StatusCreated, pay)
		return err
	})
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeResponse(w, resp)
}
