package httpapi

import (
	"context"
	"fmt"
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
	r.With(requireScope(auth.ScopeRefundsWrite, a.log)).Post("/{id}/refunds", a.createRefund)
	r.With(requireScope(auth.ScopeRefundsRead, a.log)).Get("/{id}/refunds", a.listRefunds)
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
		Execute: func(ctx context.Context, tx pgx.Tx) (idempotency.Outcome, error) {
			p, err := payments.Create(ctx, tx, a.outbox, req.Principal, in)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusCreated, p)
			return idempotency.Outcome{Response: resp, ResourceRef: p.ID.String()}, err
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
	err = a.read(r, func(ctx context.Context, tx pgx.Tx) (err error) {
		p, err = payments.Get(ctx, tx, id)
		return err
	})
	a.respond(w, r, p, err)
}

// pathID reads the {id} path parameter. Anything that is not a UUID cannot
// name a resource, so it is answered like a missing one.
func pathID(r *http.Request) (uuid.UUID, error) {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return uuid.UUID{}, errNotFound
	}
	return id, nil
}

// rederive re-renders a stored 201 response from the resource it showed,
// read with get, for replays whose body was too large to store.
func rederive[T any](get func(context.Context, database.DBTX, uuid.UUID) (T, error)) func(context.Context, pgx.Tx, string) (idempotency.Response, error) {
	return func(ctx context.Context, tx pgx.Tx, ref string) (idempotency.Response, error) {
		id, err := uuid.Parse(ref)
		if err != nil {
			return idempotency.Response{}, fmt.Errorf("stored resource reference %q: %w", ref, err)
		}
		v, err := get(ctx, tx, id)
		if err != nil {
			return idempotency.Response{}, err
		}
		return renderJSON(http.StatusCreated, v)
	}
}

// read runs fn in a read-only transaction that sees only the caller's rows.
func (a *api) read(r *http.Request, fn func(context.Context, pgx.Tx) error) error {
	p, ok := auth.FromContext(r.Context())
	if !ok {
		return auth.ErrUnauthenticated
	}
	return database.InTenantTx(r.Context(), a.pool, p.ID, database.TxOptions{ReadOnly: true}, func(tx pgx.Tx) error {
		return fn(r.Context(), tx)
	})
}

// respond writes v as a 200 JSON body, or the problem err maps to.
func (a *api) respond(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	resp, err := renderJSON(http.StatusOK, v)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeResponse(w, resp)
}
