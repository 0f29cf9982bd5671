package simulator_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/processor"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
)

// A cancel closes a key through processor.Client: a charge already made
// stays made and is what the cancel answers; a key with nothing processed
// answers "no record" and never charges afterwards, not even for a request
// that had arrived before the cancel and is processed after it.
func TestCancelClosesTheKey(t *testing.T) {
	t.Parallel()
	sim := simulator.New(simulator.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	c := processor.NewClient(srv.URL, &http.Client{Timeout: 5 * time.Second})
	ctx := context.Background()

	charged, err := c.Charge(ctx, processor.Charge{Key: "made", Amount: 1000, Currency: "usd"})
	require.NoError(t, err)
	res, err := c.Cancel(ctx, processor.Record{Op: processor.OpCharge, Key: "made"})
	require.NoError(t, err, "a cancel undoes nothing: the charge is its answer")
	require.Equal(t, charged, res)

	// Long enough for the lookup and the cancel to come first on a loaded
	// machine.
	sim.SetConfig(simulator.Config{CommitDelay: 2 * time.Second})
	late := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, processor.Charge{Key: "late", Amount: 1000, Currency: "usd"})
		late <- err
	}()
	require.Eventually(t, func() bool { return sim.Waiting() == 1 }, 5*time.Second, 5*time.Millisecond)
	_, err = c.Lookup(ctx, processor.Record{Op: processor.OpCharge, Key: "late"})
	require.ErrorIs(t, err, processor.ErrNoRecord, "received, not processed yet")
	_, err = c.Cancel(ctx, processor.Record{Op: processor.OpCharge, Key: "late"})
	require.ErrorIs(t, err, processor.ErrNoRecord)
	require.Error(t, <-late, "the late request's answer is not a charge")
	require.Zero(t, sim.Effects("late"))
	_, err = c.Charge(ctx, processor.Charge{Key: "late", Amount: 1000, Currency: "usd"})
	require.Error(t, err, "a closed key never charges")
	require.Zero(t, sim.Effects("late"))
	_, err = c.Lookup(ctx, processor.Record{Op: processor.OpCharge, Key: "late"})
	require.ErrorIs(t, err, processor.ErrNoRecord)
}
