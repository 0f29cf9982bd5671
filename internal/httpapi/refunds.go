package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/refunds"
)

// refundRoutes serves /v1/refunds; the refunds of one payment live under
// /v1/payments/{id}/refunds (paymentRoutes).
func (a *api) refundRoutes() chi.Router {
	r := chi.NewRouter()
	r.With(requireScope(auth.ScopeRefundsRead, a.log)).Get("/{id}", a.getRefund)
	return r
}

// refundList is the body of GET /v1/payments/{id}/refunds.
type refundList struct {
	Data    []refunds.Refund `json:"data"`
	HasMore bool             `json:"has_more"`
}

func (a *api) createRefund(w http.ResponseWriter, r *http.Request) {
	paymentID, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var in refunds.NewRefund
	req, err := a.parseIdempotent(w, r, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, tx pgx.Tx) (idempotency.Outcome, error) {
			// Locking the payment serializes refunds of one payment, so two
			// refunds with different keys cannot both spend the same remainder.
			// A payment of another principal is invisible here (row-level
			// security): the error rolls back the claim and the caller gets 404.
			p, err := payments.GetForUpdate(ctx, tx, paymentID)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			refund, err := refunds.Create(ctx, tx, req.Principal, refunds.Payment{ID: p.ID, Currency: p.Currency, Refundable: p.Refundable()}, in)
			var exceeds *refunds.ExceedsError
			if errors.As(err, &exceeds) {
				// A business outcome, stored as failed and replayed as is.
				detail := fmt.Sprintf("The refund of %d exceeds the %d that remains refundable on this payment.", exceeds.Requested, exceeds.Remaining)
				return idempotency.Outcome{
					Response: idempotency.Response{
						Status:      ptRefundExceeds.status,
						ContentType: ContentTypeProblem,
						Body:        newProblem(ptRefundExceeds, detail).render(r),
					},
					Failed: true,
				}, nil
			}
			if err != nil {
				return idempotency.Outcome{}, err
			}
			if err := payments.AddRefunded(ctx, tx, p.ID, refund.Amount); err != nil {
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusCreated, refund)
			return idempotency.Outcome{Response: resp, ResourceRef: refund.ID.String()}, err
		},
		Rederive: rederive(refunds.Get),
		// The stored response is shown only while the payment is still the
		// caller's: row-level security hides it otherwise.
		Reauthorize: func(ctx context.Context, tx pgx.Tx) error {
			_, err := payments.Get(ctx, tx, paymentID)
			return err
		},
	})
}

func (a *api) listRefunds(w http.ResponseWriter, r *http.Request) {
	paymentID, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var list refundList
	err = a.read(r, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := payments.Get(ctx, tx, paymentID); err != nil {
			return err
		}
		list.Data, list.HasMore, err = refunds.List(ctx, tx, paymentID)
		return err
	})
	a.respond(w, r, list, err)
}

func (a *api) getRefund(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var refund refunds.Refund
	err = a.read(r, func(ctx context.Context, tx pgx.Tx) (err error) {
		refund, err = refunds.Get(ctx, tx, id)
		return err
	})
	a.respond(w, r, refund, err)
}
