package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// paymentRoutes serves /v1/payments.
func (a *api) paymentRoutes() chi.Router {
	r := chi.NewRouter()
	r.With(requireScope(auth.ScopePaymentsWrite, a.log)).Post("/", a.createPayment)
	r.With(requireScope(auth.ScopePaymentsRead, a.log)).Get("/{id}", a.getPayment)
	return r
}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	var in payments.NewPayment
	canonical, err := decodeJSON(w, r, a.maxBodyBytes, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	req, err := idempotentRequest(r, canonical)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	// Validation happens before the claim: a rejected request consumes no key.
	if err := in.Validate(); err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, tx pgx.Tx) (idempotency.Outcome, error) {
			p, err := payments.Create(ctx, tx, req.Principal, in)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusCreated, p)
			return idempotency.Outcome{Response: resp}, err
		},
	})
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, r, a.log, errNotFound)
		return
	}
	var pay payments.Payment
	err = database.InTenantTx(r.Context(), a.pool, p.ID, database.TxOptions{}, func(tx pgx.Tx) (err error) {
		pay, err = payments.Get(r.Context(), tx, id)
		return err
	})
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	resp, err := renderJSON(http.StatusOK, pay)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeResponse(w, resp)
}
