package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	paymentsclient "github.com/payments-reference/idempotent-payments/client"

	"github.com/payments-reference/idempotent-payments/loadtest/designs"
)

// driver sends payment requests: new keys, and a share of retries of keys it
// used before (replays).
type driver struct {
	base    string
	cfg     config
	clients []client
	http    *http.Client
	// api sends /v1/payments through the client package, one per client,
	// with retries off: the load test measures single requests, and a
	// retry would hide the failure it is there to count.
	api []*paymentsclient.Client

	mu   sync.Mutex
	used map[string][]sent // by path: completed requests that a later one may retry
}

// idempotentPaths are the paths that take an Idempotency-Key and replay:
// this service's, and the load test's Redis-claim peer.
var idempotentPaths = map[string]bool{"/v1/payments": true, designs.PeerPath: true}

type sent struct {
	client  int
	key     string
	payment paymentsclient.NewPayment
}

// paymentsPath is the service's own payment route, which the client package
// covers; the other routes are the load test's own.
const paymentsPath = "/v1/payments"

func newDriver(base string, cfg config, clients []client) *driver {
	tr := &http.Transport{MaxIdleConns: 4 * cfg.concurrency, MaxIdleConnsPerHost: 4 * cfg.concurrency, IdleConnTimeout: time.Minute}
	dr := &driver{base: base, cfg: cfg, clients: clients, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, used: map[string][]sent{}}
	for _, c := range clients {
		api, err := paymentsclient.New(base, c.secret, paymentsclient.UseHTTPClient(dr.http),
			paymentsclient.WithRetryPolicy(paymentsclient.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			panic(err) // only a malformed base URL, which main has parsed already
		}
		dr.api = append(dr.api, api)
	}
	return dr
}

// sample is one request's outcome.
type sample struct {
	latency time.Duration
	claim   time.Duration // from Server-Timing; -1 when absent
	replay  bool
	status  int // 0: transport error
}

// measurement is every sample of one run.
type measurement struct {
	samples []sample
}

// run drives path for d with cfg.concurrency clients, closed loop or at
// cfg.rate, and prints a live line to progress when it is not nil. A share
// of the requests, replayShare, retries keys the run used before; 1 sends
// nothing but replays.
func (dr *driver) run(ctx context.Context, path string, replayShare float64, d time.Duration, progress io.Writer, label string) measurement {
	// The run's end stops new requests; those in flight finish with ctx,
	// so the server sees no cancelled request at a stage boundary.
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	replays := idempotentPaths[path] && replayShare > 0

	// Open loop: a ticker hands out intended start times, and latency counts
	// from them, so a slow server cannot hide its queueing (no coordinated
	// omission). Closed loop: each client sends when it gets an answer.
	var tokens chan time.Time
	if dr.cfg.rate > 0 {
		tokens = make(chan time.Time, dr.cfg.concurrency*4)
		go func() {
			interval := time.Duration(float64(time.Second) / dr.cfg.rate)
			next := time.Now()
			for {
				select {
				case <-runCtx.Done():
					close(tokens)
					return
				case <-time.After(time.Until(next)):
				}
				select {
				case tokens <- next:
				default: // every client is busy: the request is late, and counted from next
				}
				next = next.Add(interval)
			}
		}()
	}

	var done atomic.Int64
	var failed atomic.Int64
	stopProgress := make(chan struct{})
	// The live line is written from its own goroutine; run waits for it to
	// stop before returning, so it never writes alongside the caller.
	var printer sync.WaitGroup
	if progress != nil {
		printer.Go(func() {
			start := time.Now()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stopProgress:
					return
				case <-t.C:
					el := time.Since(start)
					fmt.Fprintf(progress, "\r%s: %2.0fs/%.0fs  %6.0f req/s  errors %d   ", label, el.Seconds(), d.Seconds(),
						float64(done.Load())/el.Seconds(), failed.Load())
				}
			}
		})
	}

	per := make([][]sample, dr.cfg.concurrency)
	var wg sync.WaitGroup
	for w := range dr.cfg.concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			for {
				intended := time.Now()
				if tokens != nil {
					var ok bool
					if intended, ok = <-tokens; !ok {
						return
					}
				}
				if runCtx.Err() != nil {
					return
				}
				s := dr.one(ctx, path, rng, replays, replayShare, intended)
				if ctx.Err() != nil && s.status == 0 {
					return // the whole load test was interrupted
				}
				per[w] = append(per[w], s)
				done.Add(1)
				if s.status < 200 || s.status > 299 {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stopProgress)
	printer.Wait()
	var m measurement
	for _, p := range per {
		m.samples = append(m.samples, p...)
	}
	return m
}

// one sends one request.
func (dr *driver) one(ctx context.Context, path string, rng *rand.Rand, replays bool, replayShare float64, intended time.Time) sample {
	var req sent
	replay := false
	if replays && rng.Float64() < replayShare {
		dr.mu.Lock()
		if used := dr.used[path]; len(used) > 0 {
			req, replay = used[rng.IntN(len(used))], true
		}
		dr.mu.Unlock()
	}
	if !replay {
		order := strconv.FormatUint(uint64(rng.Uint32()), 10)
		req = sent{
			client: rng.IntN(len(dr.clients)),
			key:    dr.newKey(),
			payment: paymentsclient.NewPayment{Amount: 1 + rng.Int64N(100000), Currency: "usd",
				Description: &loadTestDescription, Metadata: &map[string]string{"order": order}},
		}
	}
	var s sample
	if path == paymentsPath {
		s = dr.viaClient(ctx, req, intended)
	} else {
		s = dr.raw(ctx, path, req, intended)
	}
	s.replay = replay
	if !replay && s.status == http.StatusCreated && idempotentPaths[path] {
		dr.mu.Lock()
		if used := dr.used[path]; len(used) < 100_000 {
			dr.used[path] = append(used, req)
		} else {
			used[rng.IntN(len(used))] = req
		}
		dr.mu.Unlock()
	}
	return s
}

// newKey is a new Idempotency-Key of the run's shape: random (UUIDv4), or
// time-ordered (UUIDv7), whose claims land at the right edge of each
// principal's part of the unique index.
func (dr *driver) newKey() string {
	if dr.cfg.keyShape == keyShapeTimeOrdered {
		return uuid.Must(uuid.NewV7()).String()
	}
	return uuid.NewString()
}

// loadTestDescription marks the load test's payments.
var loadTestDescription = "load test"

// viaClient sends a payment to the service through the client package.
func (dr *driver) viaClient(ctx context.Context, req sent, intended time.Time) sample {
	s := sample{claim: -1}
	_, _ = dr.api[req.client].CreatePayment(ctx, req.payment, paymentsclient.WithIdempotencyKey(req.key),
		paymentsclient.OnAttempt(func(a paymentsclient.Attempt) {
			s.status = a.StatusCode
			if a.Header != nil {
				s.claim = serverTimingClaim(a.Header.Get("Server-Timing"))
			}
		}))
	s.latency = time.Since(intended)
	return s
}

// raw sends a payment to one of the load test's own routes (the baseline
// and the peer), which are not part of the API and so not in the client.
func (dr *driver) raw(ctx context.Context, path string, req sent, intended time.Time) sample {
	body, err := json.Marshal(req.payment)
	if err != nil {
		return sample{status: 0, claim: -1}
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, dr.base+path, bytes.NewReader(body))
	if err != nil {
		return sample{status: 0, claim: -1}
	}
	hr.Header.Set("Authorization", "Bearer "+dr.clients[req.client].secret)
	hr.Header.Set("Content-Type", "application/json")
	// The baseline runs the same handler as POST /v1/payments, which reads
	// the key; only its store is gone (loadtest/designs).
	hr.Header.Set("Idempotency-Key", req.key)
	resp, err := dr.http.Do(hr)
	if err != nil {
		return sample{latency: time.Since(intended), status: 0, claim: -1}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return sample{latency: time.Since(intended), status: resp.StatusCode, claim: serverTimingClaim(resp.Header.Get("Server-Timing"))}
}

// serverTimingClaim reads "claim;dur=1.234" (milliseconds).
func serverTimingClaim(h string) time.Duration {
	for part := range strings.SplitSeq(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if name != "claim" {
			continue
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(params), "dur="); ok {
			if ms, err := strconv.ParseFloat(v, 64); err == nil {
				return time.Duration(ms * float64(time.Millisecond))
			}
		}
	}
	return -1
}

// fill writes m's throughput and exact percentiles (from every sample, not
// averages of averages) into st.
func (m measurement) fill(st *Stage, d time.Duration) {
	var all, claims, replays []float64
	st.Errors = map[string]int{}
	for _, s := range m.samples {
		if s.status < 200 || s.status > 299 {
			key := strconv.Itoa(s.status)
			if s.status == 0 {
				key = "transport"
			}
			st.Errors[key]++
			continue
		}
		ms := float64(s.latency) / float64(time.Millisecond)
		all = append(all, ms)
		if s.claim >= 0 {
			claims = append(claims, float64(s.claim)/float64(time.Millisecond))
		}
		if s.replay {
			replays = append(replays, ms)
		}
	}
	st.Requests = len(all)
	st.Replays = len(replays)
	st.RPS = float64(len(all)) / d.Seconds()
	st.RequestP50, st.RequestP99, st.RequestP999 = percentile(all, 0.50), percentile(all, 0.99), percentile(all, 0.999)
	st.ClaimP50, st.ClaimP99 = percentile(claims, 0.50), percentile(claims, 0.99)
	st.ReplayP99 = percentile(replays, 0.99)
}

// percentile is the nearest-rank percentile of xs (0 when empty).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
