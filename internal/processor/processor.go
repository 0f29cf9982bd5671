// Package processor is the boundary to a payment processor (a card network,
// Stripe, Adyen, a bank): the one effect of a payment that cannot share the
// database transaction.
//
// Every call carries a key of its own, which the processor uses the way this
// service uses Idempotency-Key: the same key is the same charge, however often
// it is sent. The service keys a call by the client's intent (the principal,
// the route, the client's Idempotency-Key and the request's fingerprint), not
// by a row's id, which a lost commit takes with it: the outbox worker can
// repeat a call whose answer was lost, and the client can repeat a request
// whose commit was lost, without charging twice.
//
// Two processors implement it here: Client, for an HTTP API of this shape
// (the Simulator speaks it), and the stripe package, for Stripe.
package processor

import (
	"context"
	"errors"
	"fmt"
)

// Charge asks the processor to take Amount (minor units) in Currency.
type Charge struct {
	// Key is the processor's idempotency key: the client's intent, which
	// a lost commit does not change (payments.CreateParams.ProcessorKey).
	Key      string `json:"-"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Reference is the merchant's reference of the call, the payment's id,
	// for the processor's records. A retry of a payment whose commit was
	// lost sends the same key with a new reference: a processor must not
	// take the reference as part of what the key's first call asked.
	Reference string `json:"reference"`
}

// Refund asks the processor to give back Amount of the charge made with
// ChargeKey.
type Refund struct {
	Key       string `json:"-"` // the client's intent, as a charge's
	ChargeKey string `json:"charge"`
	// ChargeID is the processor's own id of that charge (its Result.ID):
	// some processors name the charge to refund only by it (Stripe's
	// payment_intent).
	ChargeID  string `json:"-"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"` // the refund's id, as a charge's
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
	Lookup(ctx context.Context, r Record) (Result, error)
	// Cancel closes the key (a technical cancel by the merchant's
	// reference, a void): once it has answered, no request with the key
	// moves money, not even one the processor received and has not
	// processed yet. It answers as Lookup, about the key as it stands once
	// closed: Result when the money had moved before (Cancel undoes
	// nothing), *DeclineError when it was declined, ErrNoRecord when nothing
	// moved and now nothing will, any other error when it could not say.
	// The reconciler cancels a key before it records "no record" as final.
	Cancel(ctx context.Context, r Record) (Result, error)
}

// Record names what Lookup asks about.
type Record struct {
	Op  Operation
	Key string // the idempotency key the calls were sent with
	// ChargeID is, for a refund, its charge's id at the processor
	// (Refund.ChargeID): some processors find a refund only through its
	// charge (Stripe lists a PaymentIntent's refunds).
	ChargeID string
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

// Verdict is what a processor's answer means for the money.
type Verdict int

// The verdicts Judge gives.
const (
	// Retry: the outcome is unknown and attempts remain; call again with
	// the same key, which cannot charge twice.
	Retry Verdict = iota
	// Moved: the processor did it (charged, refunded).
	Moved
	// NotMoved: a definite no (declined, refused, no record); the reason
	// says which.
	NotMoved
	// Unknown: no definite answer and no attempt left. The money may or may
	// not have moved; only the processor's record can tell (reconcile).
	Unknown
)

// Reasons Judge gives for NotMoved besides a decline's own code.
const (
	// ReasonRejected: the processor refused the request itself (a bug on
	// this side); nothing moved.
	ReasonRejected = "processor_rejected"
	// ReasonNoRecord: asked after every attempt had ended, the processor has
	// no record of the key; nothing moved.
	ReasonNoRecord = "not_processed"
)

// Judge classifies the error of a call (a charge, a refund, or a lookup)
// into a verdict, and for NotMoved the reason to record. last says whether
// the call was the job's last attempt: an unknown outcome then is Unknown,
// never NotMoved, because the processor may have moved the money on an
// attempt whose answer was lost.
func Judge(err error, last bool) (Verdict, string) {
	var declined *DeclineError
	var rejected *RejectedError
	switch {
	case err == nil:
		return Moved, ""
	case errors.As(err, &declined):
		return NotMoved, declined.Reason
	case errors.As(err, &rejected):
		return NotMoved, ReasonRejected
	case errors.Is(err, ErrNoRecord):
		return NotMoved, ReasonNoRecord
	case last:
		return Unknown, ""
	}
	return Retry, ""
}
