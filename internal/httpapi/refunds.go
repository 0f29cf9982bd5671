package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
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
	r.With(requireScope(auth.ScopeRefundsRead)).Get("/{id}", a.getRefund)
	return r
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
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			// A payment of another principal is invisible here (row-level
			// security): the error rolls back the claim and the caller gets 404.
			refund, writes, err := refunds.Request(ctx, w.Tx, a.outbox, refunds.RequestParams{Principal: w.Principal, Origin: origin(w),
				PaymentID: paymentID, New: in, Now: w.Now, ProcessorKey: w.Intent})
			var exceeds *refunds.ExceedsError
			switch {
			case errors.As(err, &exceeds):
				// Business outcomes, stored as failed and replayed as they are.
				detail := fmt.Sprintf("The refund of %d exceeds the %d that remains refundable on this payment (pending refunds count).", exceeds.Requested, exceeds.Remaining)
				if exceeds.Remaining == 0 {
					detail = "The payment has been refunded in full (pending refunds count): nothing remains to refund."
				}
				return storedProblem(r, ptRefundExceeds, detail), nil
			case errors.Is(err, refunds.ErrPaymentFailed):
				return storedProblem(r, ptNotRefundable, "The payment failed, so there is nothing to refund."), nil
			case err != nil:
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusCreated, refund)
			return idempotency.Outcome{Response: resp, ResourceRef: refund.ID.String(), Writes: writes}, err
		},
		Rederive: rederive(refunds.Get),
		// The stored response is shown only while the payment is still the
		// caller's: row-level security hides it otherwise.
		Reauthorize: func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) error {
			_, err := payments.Get(ctx, tx, principal, paymentID)
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
	pg, err := parsePage(r, refunds.ListLimit)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var list listBody[refunds.Refund]
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) error {
		if _, err := payments.Get(ctx, tx, principal, paymentID); err != nil {
			return err
		}
		list.Data, list.HasMore, err = refunds.List(ctx, tx, principal, paymentID, pg.after, pg.limit)
		return err
	})
	a.respond(w, r, list, err)
}

func (a *api) getRefund(w http.ResponseWriter, r *http.Request) {
	showOne(a, w, r, refunds.Get)
}
