package client

import (
	"context"
	"net/http"

	"github.com/google/uuid"
)

// The refunds' calls, in a file of their own: a fork without refunds
// deletes it (docs/fork.md).

// CreateRefund refunds the payment once for this intent. A refund larger
// than what remains, or of a failed payment, is an *Error (422) that the
// same key will keep answering.
func (c *Client) CreateRefund(ctx context.Context, paymentID uuid.UUID, r NewRefund, opts ...CallOption) (*Refund, error) {
	o := options(true, opts)
	key := o.key
	var out Refund
	err := c.call(ctx, o, http.MethodPost, "/v1/payments/{id}/refunds", &out, func() (*http.Request, error) {
		return NewCreateRefundRequest(c.raw.Server, paymentID.String(), &CreateRefundParams{IdempotencyKey: key}, r)
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// GetRefund reads a refund.
func (c *Client) GetRefund(ctx context.Context, id uuid.UUID, opts ...CallOption) (*Refund, error) {
	var out Refund
	if err := c.call(ctx, options(false, opts), http.MethodGet, "/v1/refunds/{id}", &out, func() (*http.Request, error) {
		return NewGetRefundRequest(c.raw.Server, id.String())
	}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListRefunds reads one page of a payment's refunds; params may be nil.
func (c *Client) ListRefunds(ctx context.Context, paymentID uuid.UUID, params *ListRefundsParams, opts ...CallOption) (*RefundList, error) {
	var out RefundList
	if err := c.call(ctx, options(false, opts), http.MethodGet, "/v1/payments/{id}/refunds", &out, func() (*http.Request, error) {
		return NewListRefundsRequest(c.raw.Server, paymentID.String(), params)
	}); err != nil {
		return nil, err
	}
	return &out, nil
}
