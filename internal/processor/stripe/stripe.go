// Package stripe charges and refunds through Stripe's API: the processor a
// fork most often starts with, and the model for another one (Adyen,
// Braintree): docs/external-effects.md says what such an adapter must keep.
//
// A charge is a PaymentIntent created and confirmed in one call, a refund a
// Refund of that PaymentIntent, each sent with the service's processor key as
// Stripe's Idempotency-Key, so that a repeated call returns the first one's
// answer instead of moving money again. Stripe keeps a key 24 hours
// (PROCESSOR_KEY_WINDOW) and replays the first answer, even a 500, for that
// long.
//
// Stripe has no lookup by idempotency key. The reconciler's lookup of a
// charge searches PaymentIntents by the key, which every charge carries in
// its metadata; Stripe's search index lags its writes (under a minute,
// normally), so "no record" is only trusted for calls older than
// RECONCILE_GRACE, which the configuration keeps above that lag. A refund is
// found among its PaymentIntent's refunds, a list that does not lag.
package stripe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	stripeapi "github.com/stripe/stripe-go/v82"

	"github.com/payments-reference/idempotent-payments/internal/processor"
)

// MetadataKey names the metadata entry that carries the processor key on
// every PaymentIntent and Refund this package makes: the reconciler finds
// them by it, and a person reading Stripe's dashboard finds the payment by
// it (payments.processor_key).
const MetadataKey = "processor_key"

// Config is what the adapter needs.
type Config struct {
	// SecretKey is the account's secret (or restricted) API key: sk_test_
	// for test mode, sk_live_ to move money.
	SecretKey string
	// URL is Stripe's API; empty means https://api.stripe.com. Tests point
	// it at stripe-mock.
	URL string
	// PaymentMethod is charged for every payment: this API takes no card,
	// so the adapter charges one the account holds (test mode:
	// pm_card_visa). A fork that takes payment methods passes each
	// payment's own instead.
	PaymentMethod string
	// HTTPClient sends the calls; its Timeout bounds one call.
	HTTPClient *http.Client
}

// Processor is processor.Processor on Stripe.
type Processor struct {
	api           *stripeapi.Client
	paymentMethod string
}

// New returns the adapter. It makes no call: a wrong key shows on the first
// charge, as an unknown outcome that is retried (the money is safe: a call
// Stripe refused moved nothing).
func New(cfg Config) *Processor {
	bc := &stripeapi.BackendConfig{
		HTTPClient: cfg.HTTPClient,
		// The outbox retries, with the same key, on its own schedule: one
		// call is one attempt, so a job's attempts are what the metrics and
		// the retry schedule count.
		MaxNetworkRetries: stripeapi.Int64(0),
		// Errors are returned, and logged by the caller with the row.
		LeveledLogger: &stripeapi.LeveledLogger{Level: stripeapi.LevelNull},
	}
	if cfg.URL != "" {
		bc.URL = stripeapi.String(strings.TrimRight(cfg.URL, "/"))
	}
	return &Processor{
		api:           stripeapi.NewClient(cfg.SecretKey, stripeapi.WithBackends(stripeapi.NewBackendsWithConfig(bc))),
		paymentMethod: cfg.PaymentMethod,
	}
}

// Charge implements processor.Processor: it creates and confirms a
// PaymentIntent, off session (the customer is not there to authenticate).
func (p *Processor) Charge(ctx context.Context, c processor.Charge) (processor.Result, error) {
	params := &stripeapi.PaymentIntentCreateParams{
		Amount:        stripeapi.Int64(c.Amount),
		Currency:      stripeapi.String(c.Currency),
		PaymentMethod: stripeapi.String(p.paymentMethod),
		Confirm:       stripeapi.Bool(true),
		OffSession:    stripeapi.Bool(true),
		// No redirect can be followed without the customer.
		AutomaticPaymentMethods: &stripeapi.PaymentIntentCreateAutomaticPaymentMethodsParams{
			Enabled:        stripeapi.Bool(true),
			AllowRedirects: stripeapi.String("never"),
		},
	}
	// The metadata carries the key, not the payment's id (c.Reference):
	// Stripe compares a repeated call's parameters, metadata included, with
	// the first one's, and a retry of a payment whose commit was lost comes
	// with a new id. With the id in the metadata Stripe would refuse that
	// retry (idempotency_error), and the payment would be recorded failed
	// while its first call had charged the customer.
	params.SetIdempotencyKey(c.Key)
	params.AddMetadata(MetadataKey, c.Key)
	pi, err := p.api.V1PaymentIntents.Create(ctx, params)
	if err != nil {
		return processor.Result{}, classify("create payment intent", err)
	}
	return intentResult(pi)
}

// Refund implements processor.Processor: it refunds Amount of the
// PaymentIntent r.ChargeID.
func (p *Processor) Refund(ctx context.Context, r processor.Refund) (processor.Result, error) {
	if r.ChargeID == "" {
		// A refund is only made of a charge Stripe answered for; without
		// its id the request cannot be right, however often it is sent.
		return processor.Result{}, &processor.RejectedError{Detail: "refund without the charge's payment intent id"}
	}
	params := &stripeapi.RefundCreateParams{
		PaymentIntent: stripeapi.String(r.ChargeID),
		Amount:        stripeapi.Int64(r.Amount),
	}
	params.SetIdempotencyKey(r.Key)
	params.AddMetadata(MetadataKey, r.Key)
	rf, err := p.api.V1Refunds.Create(ctx, params)
	if err != nil {
		return processor.Result{}, classify("create refund", err)
	}
	return refundResult(rf)
}

// Lookup implements processor.Processor.
func (p *Processor) Lookup(ctx context.Context, rec processor.Record) (processor.Result, error) {
	switch rec.Op {
	case processor.OpCharge:
		return p.lookupCharge(ctx, rec.Key)
	case processor.OpRefund:
		return p.lookupRefund(ctx, rec)
	}
	return processor.Result{}, fmt.Errorf("stripe lookup: unknown operation %q", rec.Op)
}

// Cancel implements processor.Processor as far as Stripe allows. Stripe has
// no cancel by idempotency key and no queue of received requests: it
// decides a call while it answers it. What can still move money later is a
// PaymentIntent that has not succeeded (one needing an action or a payment
// method can be completed by someone else; an uncaptured one, captured), so
// Cancel cancels the PaymentIntent that carries the key, if it is one of
// those, and answers as Lookup about it. When the search finds none, it
// answers ErrNoRecord as Lookup does: with Stripe, the reconciler's grace
// (at least 5 minutes, for the search's lag) is what makes that final. A
// refund is only looked up: Stripe cancels few kinds of refund.
func (p *Processor) Cancel(ctx context.Context, rec processor.Record) (processor.Result, error) {
	if rec.Op != processor.OpCharge {
		return p.Lookup(ctx, rec)
	}
	pi, err := p.findIntent(ctx, rec.Key)
	if err != nil {
		return processor.Result{}, err
	}
	switch pi.Status {
	case stripeapi.PaymentIntentStatusRequiresPaymentMethod, stripeapi.PaymentIntentStatusRequiresConfirmation,
		stripeapi.PaymentIntentStatusRequiresAction, stripeapi.PaymentIntentStatusRequiresCapture:
		params := &stripeapi.PaymentIntentCancelParams{CancellationReason: stripeapi.String(string(stripeapi.PaymentIntentCancellationReasonAbandoned))}
		// Canceling twice is refused (the second finds it canceled): the
		// same call with the same key gets the first answer instead.
		params.SetIdempotencyKey("cancel-" + rec.Key)
		if pi, err = p.api.V1PaymentIntents.Cancel(ctx, pi.ID, params); err != nil {
			return processor.Result{}, unanswered("cancel payment intent", err)
		}
	}
	return intentResult(pi)
}

// lookupCharge searches the PaymentIntents that carry key. More than one
// means the key was sent again after Stripe forgot it: the configuration
// keeps retries inside the key's window, so it is reported, never chosen.
func (p *Processor) lookupCharge(ctx context.Context, key string) (processor.Result, error) {
	pi, err := p.findIntent(ctx, key)
	if err != nil {
		return processor.Result{}, err
	}
	return intentResult(pi)
}

// findIntent searches the PaymentIntent that carries key: ErrNoRecord when
// there is none.
func (p *Processor) findIntent(ctx context.Context, key string) (*stripeapi.PaymentIntent, error) {
	params := &stripeapi.PaymentIntentSearchParams{}
	params.Query = fmt.Sprintf("metadata['%s']:'%s'", MetadataKey, quote(key))
	params.Limit = stripeapi.Int64(2)
	var found []*stripeapi.PaymentIntent
	for pi, err := range p.api.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return nil, unanswered("search payment intents", err)
		}
		found = append(found, pi)
		if len(found) > 1 {
			return nil, fmt.Errorf("stripe: %d payment intents carry one processor key (%s and %s): look at both", len(found), found[0].ID, found[1].ID)
		}
	}
	if len(found) == 0 {
		return nil, processor.ErrNoRecord
	}
	return found[0], nil
}

// lookupRefund lists the refunds of the charge's PaymentIntent for the one
// that carries the key.
func (p *Processor) lookupRefund(ctx context.Context, rec processor.Record) (processor.Result, error) {
	if rec.ChargeID == "" {
		return processor.Result{}, errors.New("stripe: a refund's lookup needs its charge's payment intent id")
	}
	params := &stripeapi.RefundListParams{PaymentIntent: stripeapi.String(rec.ChargeID)}
	for rf, err := range p.api.V1Refunds.List(ctx, params) {
		if err != nil {
			return processor.Result{}, unanswered("list refunds", err)
		}
		if rf.Metadata[MetadataKey] == rec.Key {
			return refundResult(rf)
		}
	}
	return processor.Result{}, processor.ErrNoRecord
}

// intentResult reads a PaymentIntent's status. Only succeeded moved money;
// a PaymentIntent that needs a payment method, an action from the customer,
// or was canceled moved none and never will without someone acting on it;
// processing (and an uncaptured authorisation, which this adapter never
// asks for) may still move it: unknown.
func intentResult(pi *stripeapi.PaymentIntent) (processor.Result, error) {
	switch pi.Status {
	case stripeapi.PaymentIntentStatusSucceeded:
		return processor.Result{ID: pi.ID}, nil
	case stripeapi.PaymentIntentStatusRequiresPaymentMethod:
		reason := string(pi.Status)
		if e := pi.LastPaymentError; e != nil {
			reason = errorReason(e, reason)
		}
		return processor.Result{}, &processor.DeclineError{Reason: reason}
	case stripeapi.PaymentIntentStatusRequiresAction, stripeapi.PaymentIntentStatusRequiresConfirmation, stripeapi.PaymentIntentStatusCanceled:
		return processor.Result{}, &processor.DeclineError{Reason: string(pi.Status)}
	}
	return processor.Result{}, fmt.Errorf("stripe: payment intent %s is %s: not decided yet", pi.ID, pi.Status)
}

// refundResult reads a Refund's status: pending (and requires_action) may
// still succeed or fail, so they are unknown; a replay of the same call
// returns the first answer, so the reconciler's lookup, which reads the
// refund as it is now, is what settles them.
func refundResult(rf *stripeapi.Refund) (processor.Result, error) {
	switch rf.Status {
	case stripeapi.RefundStatusSucceeded:
		return processor.Result{ID: rf.ID}, nil
	case stripeapi.RefundStatusFailed, stripeapi.RefundStatusCanceled:
		reason := string(rf.Status)
		if rf.FailureReason != "" {
			reason = string(rf.FailureReason)
		}
		return processor.Result{}, &processor.DeclineError{Reason: reason}
	}
	return processor.Result{}, fmt.Errorf("stripe: refund %s is %s: not decided yet", rf.ID, rf.Status)
}

// classify maps a failed call onto the processor package's classes. Only
// Stripe's own answers are definite: a card error is a decline; a request
// Stripe validated and refused (400, 404, or an idempotency key sent with
// other parameters) is a rejection, unless Stripe says to retry it
// (Stripe-Should-Retry: true). Everything else (no answer, 401 and 403, which
// a key fixed later cures, 409 for a concurrent call with the same key, 429,
// 5xx) is an unknown outcome, repeated with the same key. Stripe replays a
// 500 to every repetition, so such a charge ends requires_reconciliation and
// is settled by the lookup.
func classify(call string, err error) error {
	var se *stripeapi.Error
	if !errors.As(err, &se) {
		return fmt.Errorf("stripe %s: %w", call, err)
	}
	shouldRetry := ""
	if se.LastResponse != nil {
		shouldRetry = se.LastResponse.Header.Get("Stripe-Should-Retry")
	}
	switch {
	case se.Type == stripeapi.ErrorTypeCard:
		return &processor.DeclineError{Reason: errorReason(se, "card_error")}
	case shouldRetry == "true":
	case se.HTTPStatusCode == http.StatusBadRequest && (se.Type == stripeapi.ErrorTypeInvalidRequest || se.Type == stripeapi.ErrorTypeIdempotency),
		se.HTTPStatusCode == http.StatusNotFound && se.Type == stripeapi.ErrorTypeInvalidRequest:
		return &processor.RejectedError{Status: se.HTTPStatusCode, Detail: fmt.Sprintf("%s: %s %s: %s", call, se.Type, se.Code, se.Msg)}
	}
	return fmt.Errorf("stripe %s: status %d, %s %s (request %s): %s", call, se.HTTPStatusCode, se.Type, se.Code, se.RequestID, se.Msg)
}

// unanswered wraps a lookup's failure as "cannot say": Stripe refusing a
// search or a list (a 400, a 404) is no answer about the charge or refund
// looked for, so it must not read as a decline or a rejection.
func unanswered(call string, err error) error {
	return fmt.Errorf("stripe %s: %w", call, err)
}

// errorReason is the most precise code Stripe gave: the issuer's decline
// code, else the error's code, else fallback.
func errorReason(e *stripeapi.Error, fallback string) string {
	switch {
	case e.DeclineCode != "":
		return string(e.DeclineCode)
	case e.Code != "":
		return string(e.Code)
	}
	return fallback
}

// quote escapes a value for a single-quoted string of Stripe's search query
// language.
func quote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s)
}
