package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/client"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/faultproxy"
)

// losingTransport loses a share of the responses to POSTs on their way back:
// the server did the work and answered, and the client sees a broken
// connection, as when a load balancer or a mobile network drops it. Another
// share arrives cut short: the status and headers, then half the body and a
// broken connection.
type losingTransport struct {
	next      http.RoundTripper
	share     float64
	truncate  float64
	lost      atomic.Int64
	truncated atomic.Int64
	mu        sync.Mutex
	rng       *rand.Rand
}

// brokenReader fails as a connection that died mid-body.
type brokenReader struct{}

func (brokenReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

var errResponseLost = errors.New("connection reset (the response was lost on its way back)")

func (l *losingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost {
		return resp, err
	}
	l.mu.Lock()
	x := l.rng.Float64()
	l.mu.Unlock()
	switch {
	case x < l.share:
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		l.lost.Add(1)
		return nil, errResponseLost
	case x < l.share+l.truncate:
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		l.truncated.Add(1)
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body[:len(body)/2]), brokenReader{}))
	}
	return resp, nil
}

// The client's half of the contract, against the real service and database:
// every intent sent through the client package while COMMITs are cut before
// and after reaching PostgreSQL, their replies swallowed, and responses lost
// or cut short on the way back to the client, ends as exactly one payment,
// and the client learns it.
func TestClientThroughConnectionCuts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: 13 s of connection cuts; the full test command (and CI) runs it")
	}
	t.Parallel()
	b := setup(t, func(o *options) {
		o.faultProxy = true
		o.noWorkers = true // only the requests' COMMITs go through the proxy
		o.requestTimeout = time.Second
	})
	secret := b.newKey(t, "acme", allScopes...).Secret

	rng := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	faults := map[faultproxy.Action]int{}
	b.proxy.OnCommit(func() faultproxy.Action {
		mu.Lock()
		defer mu.Unlock()
		a := faultproxy.Forward
		switch x := rng.Float64(); {
		case x < 0.15:
			a = faultproxy.CutBefore
		case x < 0.30:
			a = faultproxy.CutAfter
		case x < 0.35:
			a = faultproxy.SwallowReply
		}
		faults[a]++
		return a
	})
	lossy := &losingTransport{next: http.DefaultTransport, share: 0.15, truncate: 0.15, rng: rand.New(rand.NewPCG(3, 4))}
	var attempts, replays atomic.Int64
	c, err := client.New(b.srv.URL, secret,
		client.UseHTTPClient(&http.Client{Transport: lossy, Timeout: 10 * time.Second}),
		client.WithRetryPolicy(client.RetryPolicy{MaxElapsed: time.Minute, BaseDelay: 20 * time.Millisecond, MaxDelay: 500 * time.Millisecond}),
		client.WithAttemptHook(func(a client.Attempt) {
			attempts.Add(1)
			if a.Header.Get("Idempotent-Replayed") == "true" {
				replays.Add(1)
			}
		}))
	require.NoError(t, err)

	const intents = 60
	ids := make([]string, intents)
	errs := make([]error, intents)
	concurrently(6, func(w int) {
		for i := w; i < intents; i += 6 {
			// A distinct amount per intent identifies its payment in the table.
			p, err := c.CreatePayment(context.Background(), client.NewPayment{Amount: int64(100*(i+1) + 1), Currency: "usd"})
			if errs[i] = err; err == nil {
				ids[i] = p.Id.String()
			}
		}
	})

	seen := map[string]bool{}
	for i := range intents {
		require.NoError(t, errs[i], "intent %d", i)
		require.False(t, seen[ids[i]], "two intents got the same payment")
		seen[ids[i]] = true
	}
	require.Equal(t, intents, b.count(t, `SELECT count(*) FROM payments`), "one payment per intent")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM (SELECT amount FROM payments GROUP BY amount HAVING count(*) > 1) d`),
		"an intent was paid twice")

	mu.Lock()
	t.Logf("%d intents, %d attempts, %d replays; COMMIT faults %v; responses lost %d, cut short %d",
		intents, attempts.Load(), replays.Load(), faults, lossy.lost.Load(), lossy.truncated.Load())
	require.Positive(t, faults[faultproxy.CutBefore])
	require.Positive(t, faults[faultproxy.CutAfter])
	mu.Unlock()
	require.Positive(t, lossy.lost.Load())
	require.Positive(t, lossy.truncated.Load())
	require.Positive(t, replays.Load(), "a committed attempt whose answer was lost is learned by a replay")
}
