package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var p payments.Payment
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		p, err = payments.Get(ctx, tx, principal, id)
		return err
	})
	a.respond(w, r, p, err)
}

// paymentList is the body of GET /v1/payments.
type paymentList struct {
	Data    []payments.Payment `json:"data"`
	HasMore bool               `json:"has_more"`
}

func (a *api) listPayments(w http.ResponseWriter, r *http.Request) {
	pg, err := parsePage(r, payments.ListLimit)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var list paymentList
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		list.Data, list.HasMore, err = payments.List(ctx, tx, principal, pg.after, pg.limit)
		return err
	})
	a.respond(w, r, list, err)
}
