package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/payments-reference/idempotent-payments/client"
)

// One intent, one key: the client makes the key and sends it on every
// attempt. When it gives up without a definite answer, the key is what
// tells, later, whether the payment happened.
func Example() {
	ctx := context.Background()
	c, err := client.New("http://localhost:8080", os.Getenv("PAYMENTS_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}

	p, err := c.CreatePayment(ctx, client.NewPayment{Amount: 2500, Currency: "usd"})
	var retry *client.RetryError
	var problem *client.Error
	switch {
	case errors.As(err, &retry) && retry.MayHaveTakenEffect:
		// Store retry.Key with the order; a later CreatePayment with
		// client.WithIdempotencyKey(retry.Key) replays the payment if it
		// happened and makes it once if it did not.
		log.Printf("payment unknown for now; retry later with key %s", retry.Key)
		return
	case errors.As(err, &problem):
		// A definite answer: validation-failed, forbidden, ...
		log.Printf("payment refused: %s: %s", problem.Slug(), problem.Detail)
		return
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println(p.Id, p.Status)

	// A refund is an intent of its own, with a key of its own. A payment
	// still processing answers 409 payment-processing, which the client
	// retries with the same key until the charge is recorded.
	amount := int64(1000)
	r, err := c.CreateRefund(ctx, p.Id.String(), client.NewRefund{Amount: &amount})
	if errors.As(err, &problem) && problem.Slug() == "refund-exceeds-payment" {
		log.Print(problem.Detail)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Id, r.Status)
}
