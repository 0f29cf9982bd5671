package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/payments-reference/idempotent-payments/client"
)

// One intent, one key: the client makes the key and sends it on every
// attempt. When it gives up without a definite answer, the key is what
// tells, later, whether the payment happened. (TestExampleAgainstTheService
// runs payAndRefund against the real service and checks what it prints.)
func Example() {
	c, err := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	if err := payAndRefund(context.Background(), c, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// payAndRefund pays 25.00, waits for the charge, and refunds 10.00 of it.
func payAndRefund(ctx context.Context, c *client.Client, out io.Writer) error {
	p, err := c.CreatePayment(ctx, client.NewPayment{Amount: 2500, Currency: "usd"})
	var retry *client.RetryError
	var problem *client.Error
	switch {
	case errors.As(err, &retry) && retry.MayHaveTakenEffect:
		// Store retry.Key with the order; a later CreatePayment with
		// client.WithIdempotencyKey(retry.Key) replays the payment if it
		// happened and makes it once if it did not.
		return fmt.Errorf("payment unknown for now; retry later with key %s", retry.Key)
	case errors.As(err, &problem):
		// A definite answer: validation-failed, forbidden, ...
		return fmt.Errorf("payment refused: %s: %s", problem.Slug(), problem.Detail)
	case err != nil:
		return err
	}
	fmt.Fprintln(out, "payment", p.Status, "livemode", p.Livemode)

	// The processor is charged after the request commits: the 201 says
	// processing, and the outcome is read back.
	for p.Status == client.PaymentStatusProcessing {
		time.Sleep(100 * time.Millisecond)
		if p, err = c.GetPayment(ctx, p.Id); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "payment", p.Status)

	// A refund is an intent of its own, with a key of its own.
	amount := int64(1000)
	r, err := c.CreateRefund(ctx, p.Id, client.NewRefund{Amount: &amount})
	if errors.As(err, &problem) && problem.Slug() == "refund-exceeds-payment" {
		return errors.New(problem.Detail)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "refund", r.Status, r.Amount)
	return nil
}
