package stripe_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/stripe"
)

// stripeMockVersion is the stripe-mock the tests run: Stripe's own mock,
// which validates every request against Stripe's OpenAPI specification and
// answers with fixtures. It keeps no state and honours no idempotency key,
// so it proves that Stripe would accept what the adapter sends and that the
// adapter reads Stripe's objects; the fake in stripe_test.go gives the
// answer classes, and the simulator proves exactly-once.
const stripeMockVersion = "v0.203.0"

// stripeMockURL is the stripe-mock this package's tests share: the one at
// STRIPE_MOCK_URL, or one TestMain starts.
var stripeMockURL string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if u := os.Getenv("STRIPE_MOCK_URL"); u != "" {
		stripeMockURL = u
		return m.Run()
	}
	u, stop, err := startStripeMock()
	if err != nil {
		fmt.Fprintln(os.Stderr, "stripe-mock:", err)
		return 1
	}
	defer stop()
	stripeMockURL = u
	return m.Run()
}

// startStripeMock installs the pinned stripe-mock from the module proxy
// (once; later runs find it in the temporary directory) and starts it on a
// free loopback port.
func startStripeMock() (string, func(), error) {
	dir := filepath.Join(os.TempDir(), "idempotent-payments-stripe-mock-"+stripeMockVersion)
	bin := filepath.Join(dir, "stripe-mock")
	if _, err := os.Stat(bin); err != nil {
		install := exec.Command("go", "install", "github.com/stripe/stripe-mock@"+stripeMockVersion)
		install.Env = append(os.Environ(), "GOBIN="+dir)
		if out, err := install.CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("go install github.com/stripe/stripe-mock@%s: %w\n%s", stripeMockVersion, err, out)
		}
	}
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:", "-https-addr", "127.0.0.1:")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	found := make(chan string, 1)
	go func() {
		listening := regexp.MustCompile(`Listening for HTTP at address: (\S+)`)
		s := bufio.NewScanner(out)
		for s.Scan() {
			if m := listening.FindStringSubmatch(s.Text()); m != nil {
				found <- "http://" + m[1]
				break
			}
		}
		for s.Scan() { // keep the pipe drained: its verbose log would fill it
		}
	}()
	select {
	case u := <-found:
		return u, stop, nil
	case <-time.After(60 * time.Second):
		stop()
		return "", nil, errors.New("did not listen within 60s")
	}
}

func onStripeMock() *stripe.Processor {
	return stripe.New(stripe.Config{SecretKey: "sk_test_123", URL: stripeMockURL, PaymentMethod: "pm_card_visa", HTTPClient: &http.Client{Timeout: 10 * time.Second}})
}

// TestStripeAcceptsEveryCall sends each call the adapter makes to
// stripe-mock. A request Stripe's specification refuses comes back as a 400
// invalid_request_error, which the adapter reads as a *RejectedError: the
// test fails on any. The fixtures' answers are then read as the mapping
// table says (a fixture PaymentIntent is requires_payment_method: a
// decline; a fixture Refund succeeded; fixture refunds carry no key).
func TestStripeAcceptsEveryCall(t *testing.T) {
	t.Parallel()
	p := onStripeMock()
	ctx := context.Background()
	accepted := func(t *testing.T, err error) {
		t.Helper()
		var rejected *processor.RejectedError
		require.False(t, errors.As(err, &rejected), "stripe-mock refused the request: %v", err)
	}

	_, err := p.Charge(ctx, processor.Charge{Key: "intent-key", Amount: 1000, Currency: "eur", Reference: "row"})
	accepted(t, err)
	var declined *processor.DeclineError
	require.ErrorAs(t, err, &declined, "the fixture PaymentIntent needs a payment method: a decline")

	res, err := p.Refund(ctx, processor.Refund{Key: "refund-key", ChargeKey: "intent-key", ChargeID: "pi_123", Amount: 500, Currency: "eur"})
	require.NoError(t, err)
	require.NotEmpty(t, res.ID, "the fixture refund succeeded")

	_, err = p.Lookup(ctx, processor.Record{Op: processor.OpCharge, Key: "intent-key"})
	accepted(t, err)
	require.ErrorAs(t, err, &declined, "the search finds the fixture PaymentIntent")

	_, err = p.Cancel(ctx, processor.Record{Op: processor.OpCharge, Key: "intent-key"})
	accepted(t, err)
	require.ErrorAs(t, err, &declined, "the fixture PaymentIntent, canceled: nothing moved")

	_, err = p.Lookup(ctx, processor.Record{Op: processor.OpRefund, Key: "refund-key", ChargeID: "pi_123"})
	require.ErrorIs(t, err, processor.ErrNoRecord, "the fixture refunds carry no processor key")
}
