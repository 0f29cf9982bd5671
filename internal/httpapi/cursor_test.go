package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A client that follows GET /v1/payments?starting_after= sees every payment
// exactly once, even while payments are being committed: the list's order
// must be final when a payment becomes visible. (Ordered by id, a UUIDv7
// made before COMMIT, a payment that commits after a later one lands behind
// a cursor that has already passed it, and the poller never sees it.)
func TestListCursorNeverSkipsConcurrentPayments(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *options) { o.noWorkers, o.maxConns = true, 8 })
	k := b.newKey(t, "poller", allScopes...)
	client := b.srv.Client()
	send := func(method, path, key, body string) (int, []byte, error) {
		req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+k.Secret)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		return resp.StatusCode, raw, err
	}

	const creators, each = 16, 60
	var mu sync.Mutex
	created := map[string]bool{}
	errs := make(chan error, creators+1)
	var creating sync.WaitGroup
	for c := range creators {
		creating.Go(func() {
			for i := range each {
				status, raw, err := send(http.MethodPost, "/v1/payments", fmt.Sprintf("c%d-%d", c, i), paymentBody)
				if err == nil && status != http.StatusCreated {
					err = fmt.Errorf("create: %d %s", status, raw)
				}
				if err != nil {
					errs <- err
					return
				}
				var p struct{ ID string }
				if err := json.Unmarshal(raw, &p); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				created[p.ID] = true
				mu.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() { creating.Wait(); close(done) }()

	// The poller follows the cursor while the creators run, and after,
	// as a client would: an empty page means "nothing new yet" (a payment
	// shows once every write transaction begun before it has ended, and
	// other tests share this server), so it stops once it has seen every
	// payment, or when nothing new has come for 15 s.
	seen := map[string]int{}
	cursor := ""
	lastNew := time.Now()
	polled := func() bool {
		select {
		case <-done:
			return len(seen) >= creators*each || time.Since(lastNew) > 15*time.Second
		default:
			return false
		}
	}
	for !polled() {
		path := "/v1/payments?limit=100"
		if cursor != "" {
			path += "&starting_after=" + cursor
		}
		status, raw, err := send(http.MethodGet, path, "", "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%s", raw)
		var page struct {
			Data []struct{ ID string }
		}
		require.NoError(t, json.Unmarshal(raw, &page))
		for _, p := range page.Data {
			seen[p.ID]++
			cursor = p.ID
			lastNew = time.Now()
		}
		if len(page.Data) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, created, creators*each)
	skipped, twice := 0, 0
	for id := range created {
		switch seen[id] {
		case 0:
			skipped++
		case 1:
		default:
			twice++
		}
	}
	require.Zero(t, twice, "payments seen more than once")
	require.Zero(t, skipped, "of %d payments, %d were never seen by the poller", len(created), skipped)
	require.Len(t, seen, len(created), "the poller saw payments nobody created")
}
