package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// paymentRoutes serves /v1/payments.
func (a *api) paymentRoutes() chi.Router {
	r := chi.NewRouter()
	r.With(requireScope(auth.ScopePaymentsWrite)).Post("/", a.createPayment)
	r.With(requireScope(auth.ScopePaymentsRead)).Get("/", a.listPayments)
	r.With(requireScope(auth.ScopePaymentsRead)).Get("/{id}", a.getPayment)
	r.With(requireScope(auth.ScopeRefundsWrite)).Post("/{id}/refunds", a.createRefund)
	r.With(requireScope(auth.ScopeRefundsRead)).Get("/{id}/refunds", a.listRefunds)
	return r
}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	var in payments.NewPayment
	req, err := a.parseIdempotent(w, r, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			p, writes, err := payments.Create(ctx, a.outbox, payments.CreateParams{Principal: w.Principal, Origin: origin(w), New: in,
				Live: a.livemode, Now: w.Now, ProcessorKey: w.Intent})
			if err != nil {
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusCreated, p)
			return idempotency.Outcome{Response: resp, ResourceRef: p.ID.String(), Writes: writes}, err
		},
		Rederive: rederive(payments.Get),
	})
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	showOne(a, w, r, payments.Get)
}

func (a *api) listPayments(w http.ResponseWriter, r *http.Request) {
	showPage(a, w, r, payments.ListLimit, payments.List)
}
