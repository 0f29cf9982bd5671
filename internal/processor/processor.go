// Package processor is the boundary to a payment processor (a card network,
// Stripe, Adyen, a bank): the one effect of a payment that cannot share the
// database transaction.
//
// Every call carries a key of its own, which the processor uses the way this
// service uses Idempotency-Key: the same key is the same charge, however often
// it is sent. The service keys a charge by its payment's id and a refund by
// its refund's id, so the outbox worker can repeat a call whose answer was
// lost without charging twice.
package processor

import (
	"context"
	"errors"
	"fmt"
)

// Charge asks the processor to take Amount (minor units) in Currency.
type Charge struct {
	Key      string `json:"-"` // the processor's idempotency key: the payment id
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Refund asks the processor to give back Amount of the charge made with
// ChargeKey.
type Refund struct {
	Key       string `json:"-"` // the refund id
	ChargeKey string `json:"charge"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

// Result is the processor's record of a charge or refund.
type Result struct {
	ID string `json:"id"`
}

// Processor charges, refunds, and looks up what it did. Its errors are a
// *DeclineError (a definite no: do not retry), a *RejectedError (the request
// itself is wrong: retrying cannot help) or anything else, which means the
// outcome is unknown and the same call, with the same key, must be repeated.
type Processor interface {
	Charge(ctx context.Context, c Charge) (Result, error)
	Refund(ctx context.Context, r Refund) (Result, error)
	// Lookup reads the processor's own record (its ledger) of the charge or
	// refund made with key, without making one: Result when it moved the
	// money, *DeclineError when it declined, ErrNoRecord when it never
	// processed a request with that key, and any other error when it could
	// not say. The reconciler settles with it what the workers could not.
	Lookup(ctx context.Context, op Operation, key string) (Result, error)
}

// Operation names what a key was used for at the processor.
type Operation string

// The two operations, as the processor's API names them.
const (
	OpCharge Operation = "charges"
	OpRefund Operation = "refunds"
)

// ErrNoRecord is a processor's definite statement that it never processed a
// request with the key: nothing moved. It is only final once no request with
// that key can still arrive (see the reconciler's grace period).
var ErrNoRecord = errors.New("the processor has no record of this key")

// DeclineError is the processor's definite refusal, with its reason
// (card_declined, insufficient_funds, ...). Nothing was charged.
type DeclineError struct{ Reason string }

func (e *DeclineError) Error() string { return "declined: " + e.Reason }

// RejectedError is a request the processor will never accept as sent: the
// key was used with other parameters, or a parameter is invalid. It means a
// bug on this side, not a fact about the customer.
type RejectedError struct {
	Status int
	Detail string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("processor rejected the request (%d): %s", e.Status, e.Detail)
}

// Definite reports whether err is an answer that repeating the call cannot
// change, as opposed to an unknown outcome.
func Definite(err error) bool {
	var d *DeclineError
	var r *RejectedError
	return errors.As(err, &d) || errors.As(err, &r)
}
