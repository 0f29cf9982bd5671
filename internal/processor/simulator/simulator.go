// Package simulator is a payment processor for development and tests: it
// speaks the wire protocol of processor.NewClient, honours idempotency keys
// as Stripe does, and misbehaves on request (Config). It sits apart from the
// processor boundary so that a fork charging a real processor can delete it.
package simulator

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Config switches the simulator's misbehaviour. Rates are probabilities
// per request, drawn independently.
type Config struct {
	// Latency passes before a request is processed. A caller that gave up
	// meanwhile is not charged: its request never arrived.
	Latency time.Duration
	// LatencyP99, when longer than Latency, makes the latency a log-normal
	// draw with median Latency and 99th percentile LatencyP99: a real
	// processor's tail, which sizes the outbox (workers >= rate x p99).
	LatencyP99 time.Duration
	// CommitDelay passes between a request's arrival and its processing,
	// whether or not its caller still waits: a processor that received a
	// charge and makes it late, after the caller gave up and after a lookup
	// said "no record". A cancel of the key in between stops it.
	CommitDelay time.Duration
	// ErrorRate answers 503 without doing anything.
	ErrorRate float64
	// DropRate charges, then closes the connection without a reply: the
	// caller cannot know it was charged.
	DropRate float64
	// TimeoutRate charges, then holds the reply for Hold, longer than any
	// sensible caller waits.
	TimeoutRate float64
	Hold        time.Duration
	// Seed makes the draws repeatable.
	Seed uint64
}

// Simulator is a payment processor that honours idempotency keys the way
// Stripe does: a key's first request is processed and its reply stored; a
// later request with the same key and parameters gets that reply again and
// charges nothing; the same key with other parameters is refused (400).
// Amounts whose last two digits are 02 are declined (402 card_declined), like
// a processor's test card. It counts, per key, how many times money actually
// moved, which is what the tests check.
type Simulator struct {
	mu      sync.Mutex
	cfg     Config
	rng     *rand.Rand
	records map[string]*record
	charges map[string]*record // succeeded charges by key, for refunds
	effects map[string]int     // key -> times money moved
	keyOf   map[string]string  // reference (a payment's or refund's id) -> the key it was sent with
	calls   int
	waiting int // requests in their Latency, not yet processed
	holding int // requests processed, their reply held or not yet sent
}

type record struct {
	// cancelled: the key was closed before anything was processed with it;
	// nothing ever moves with it.
	cancelled bool
	params    string // the request's parameters, canonical JSON
	status    int
	body      []byte
	amount    int64
	refunded  int64
}

// New returns a simulator with cfg's switches.
func New(cfg Config) *Simulator {
	return &Simulator{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		records: map[string]*record{}, charges: map[string]*record{}, effects: map[string]int{}, keyOf: map[string]string{}}
}

// SetConfig changes the switches; requests already waiting keep the old ones.
func (s *Simulator) SetConfig(cfg Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = cfg
}

// Effects returns how many times money moved for key: 0 or 1 for a processor
// that keeps its promise.
func (s *Simulator) Effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

// EffectsFor returns how many times money moved for the key that reference
// (a payment's or refund's id) was sent with: 0 if it never was.
func (s *Simulator) EffectsFor(reference string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := s.keyOf[reference]
	if !ok {
		return 0
	}
	return s.effects[key]
}

// KeyFor returns the key that reference was sent with, "" if none was.
func (s *Simulator) KeyFor(reference string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keyOf[reference]
}

// ReferencesPerKey returns, per key, how many references (payment or refund
// ids) it was sent with. A key sent with two is one intent whose row was
// made twice (a lost commit, retried): keyed by the row's id instead, it
// would have moved money twice.
func (s *Simulator) ReferencesPerKey() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := make(map[string]int, len(s.keyOf))
	for _, key := range s.keyOf {
		n[key]++
	}
	return n
}

// Waiting is how many requests are in their Latency or CommitDelay: not
// processed yet.
func (s *Simulator) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// Holding is how many requests have been processed and wait for their reply
// to be sent (TimeoutRate's Hold).
func (s *Simulator) Holding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holding
}

// Stats is what the simulator saw.
type Stats struct {
	Calls   int            `json:"calls"`
	Effects map[string]int `json:"effects"`
}

// Stats returns a copy of the counts.
func (s *Simulator) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Calls: s.calls, Effects: make(map[string]int, len(s.effects))}
	for k, n := range s.effects {
		st.Effects[k] = n
	}
	return st
}

// ServeHTTP serves POST /v1/charges, POST /v1/refunds, their lookups
// GET /v1/charges/{key} and GET /v1/refunds/{key}, their cancels
// POST /v1/charges/{key}/cancel and POST /v1/refunds/{key}/cancel, and
// GET /v1/stats.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel") &&
		(strings.HasPrefix(r.URL.Path, "/v1/charges/") || strings.HasPrefix(r.URL.Path, "/v1/refunds/")):
		key := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/v1/charges/"), "/v1/refunds/"), "/cancel")
		s.cancel(w, key)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/charges":
		s.serve(w, r, false)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/refunds":
		s.serve(w, r, true)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/charges/"):
		s.lookup(w, strings.TrimPrefix(r.URL.Path, "/v1/charges/"))
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/refunds/"):
		s.lookup(w, strings.TrimPrefix(r.URL.Path, "/v1/refunds/"))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/stats":
		writeJSON(w, http.StatusOK, s.Stats())
	default:
		http.NotFound(w, r)
	}
}

// lookup answers from the ledger: the stored reply of key, or 404
// no_record. It is never subject to the fault switches' drops and holds, only
// to ErrorRate: a processor that is down cannot be asked either. Records are
// kept for the simulator's lifetime, as a processor's ledger outlives its
// idempotency window.
func (s *Simulator) lookup(w http.ResponseWriter, key string) {
	s.mu.Lock()
	fail := s.rng.Float64() < s.cfg.ErrorRate
	rec, seen := s.records[key]
	s.mu.Unlock()
	switch {
	case fail:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "unavailable"})
	case !seen:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no_record"})
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
	}
}

// cancel closes key: a request with it that is on its way, or processed
// later, moves nothing. It answers with the key's record as it stands once
// closed (404 no_record when nothing had been processed): a charge made
// before the cancel stays made. Like a lookup, it is subject to ErrorRate
// only.
func (s *Simulator) cancel(w http.ResponseWriter, key string) {
	s.mu.Lock()
	fail := s.rng.Float64() < s.cfg.ErrorRate
	rec, seen := s.records[key]
	if !fail && !seen {
		rec = &record{cancelled: true, status: http.StatusNotFound, body: []byte(`{"error":"no_record"}`)}
		s.records[key] = rec
	}
	s.mu.Unlock()
	if fail {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "unavailable"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body)
}

// drawLatency is one request's latency under cfg: Latency, or a log-normal
// draw when LatencyP99 gives a tail. ln(latency) ~ N(ln median, sigma) with
// sigma = ln(p99/median) / z(0.99).
func drawLatency(rng *rand.Rand, cfg Config) time.Duration {
	if cfg.LatencyP99 <= cfg.Latency || cfg.Latency <= 0 {
		return cfg.Latency
	}
	sigma := math.Log(float64(cfg.LatencyP99)/float64(cfg.Latency)) / 2.3263
	return time.Duration(float64(cfg.Latency) * math.Exp(sigma*rng.NormFloat64()))
}

func (s *Simulator) serve(w http.ResponseWriter, r *http.Request, refund bool) {
	key := r.Header.Get("Idempotency-Key")
	// What the key asks, compared on a repeat; the reference is the
	// merchant's note beside it, left out: a retry of a payment whose commit
	// was lost comes with the same key and a new payment id.
	type asked struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		Charge   string `json:"charge"`
	}
	var in struct {
		asked
		Reference string `json:"reference"`
	}
	if key == "" || json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&in) != nil || in.Amount <= 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	if in.Reference != "" {
		s.mu.Lock()
		s.keyOf[in.Reference] = key
		s.mu.Unlock()
	}
	s.mu.Lock()
	cfg := s.cfg
	latency := drawLatency(s.rng, cfg)
	s.waiting++
	s.mu.Unlock()
	arrived := sleep(r.Context(), latency)
	s.mu.Lock()
	s.waiting--
	s.mu.Unlock()
	if !arrived {
		return
	}
	if cfg.CommitDelay > 0 {
		// Arrived: processed later whatever the caller does meanwhile.
		s.mu.Lock()
		s.waiting++
		s.mu.Unlock()
		time.Sleep(cfg.CommitDelay)
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
	}

	s.mu.Lock()
	s.calls++
	fail, drop, hold := s.rng.Float64() < cfg.ErrorRate, s.rng.Float64() < cfg.DropRate, s.rng.Float64() < cfg.TimeoutRate
	if fail {
		s.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "unavailable"})
		return
	}
	params, _ := json.Marshal(in.asked)
	rec, seen := s.records[key]
	switch {
	case seen && rec.cancelled: // closed before it was processed: nothing moves
	case seen && rec.params != string(params):
		s.mu.Unlock()
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "idempotency_key_reused"})
		return
	case !seen:
		rec = s.process(key, string(params), in.Amount, in.Charge, refund)
		s.records[key] = rec
	}
	status, body := rec.status, rec.body
	s.mu.Unlock()

	switch {
	case drop:
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
			return
		}
		panic(http.ErrAbortHandler) // closes the connection without a reply
	case hold:
		s.mu.Lock()
		s.holding++
		s.mu.Unlock()
		sent := sleep(r.Context(), cfg.Hold)
		s.mu.Lock()
		s.holding--
		s.mu.Unlock()
		if !sent {
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// process decides a new key's outcome and moves the money. s.mu is held.
func (s *Simulator) process(key, params string, amount int64, charge string, refund bool) *record {
	rec := &record{params: params, amount: amount}
	reply := func(status int, v any) *record {
		rec.status = status
		rec.body, _ = json.Marshal(v)
		return rec
	}
	if refund {
		ch, ok := s.charges[charge]
		if !ok || ch.refunded+amount > ch.amount {
			return reply(http.StatusUnprocessableEntity, map[string]string{"error": "charge_not_refundable"})
		}
		ch.refunded += amount
		s.effects[key]++
		return reply(http.StatusOK, map[string]string{"id": "re_" + key})
	}
	if amount%100 == 2 {
		return reply(http.StatusPaymentRequired, map[string]string{"error": "card_declined"})
	}
	s.charges[key] = rec
	s.effects[key]++
	return reply(http.StatusOK, map[string]string{"id": "ch_" + key})
}

// sleep waits d, or less if ctx ends first; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
