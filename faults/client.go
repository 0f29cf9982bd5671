package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// intent is one thing a client wants done once: a payment, or a refund of a
// payment it was told exists. It keeps one Idempotency-Key for every attempt.
type intent struct {
	key       string
	secret    string // the API key of the tenant it is for
	paymentID string // set for a refund
	amount    int64
	phase     int  // the phase it began in
	unknown   bool // an attempt was answered outcome-unknown
	// unknownPhase is the phase of the first outcome-unknown answer.
	unknownPhase int
}

// reply is what one attempt got back.
type reply struct {
	status   int    // 0: no HTTP response (connection refused, reset, timeout)
	problem  string // the problem type's slug, for an error
	reqID    string // X-Request-Id
	replayed bool
	id       string // the created resource's id, for a 201
}

// final reports whether a client stops retrying after r. It retries what the
// contract says to retry with the same key: no response, 408, 409, 429 and
// every 5xx (a 500 had no effect, a 503 either had none or is an unknown
// outcome that only the same key can resolve).
func (r reply) final() bool {
	switch {
	case r.status == 0, r.status == http.StatusRequestTimeout, r.status == http.StatusConflict,
		r.status == http.StatusTooManyRequests, r.status >= 500:
		return false
	}
	return true
}

// noEffect reports whether r told the client that the attempt had no effect:
// anything but a success, a stored business outcome (a refund that exceeds
// what remains, or of a failed payment), an unknown outcome and no response
// at all. If such an attempt's request id is later found as the
// producer of a stored outcome, the service lied.
func (r reply) noEffect() bool {
	switch {
	case r.status == 0, r.status/100 == 2, r.problem == "outcome-unknown",
		r.problem == "refund-exceeds-payment", r.problem == "payment-not-refundable": // stored business outcomes
		return false
	}
	return true
}

// label names r for the report.
func (r reply) label() string {
	switch {
	case r.status == 0:
		return "no response"
	case r.status == http.StatusCreated && r.replayed:
		return "201 replayed"
	case r.problem != "":
		return fmt.Sprintf("%d %s", r.status, r.problem)
	}
	return fmt.Sprint(r.status)
}

// client sends attempts, each with its intent's API key.
type client struct {
	http *http.Client
	base func() string
	// patience, when set, is how long an attempt waits for its answer
	// before the client hangs up, shorter than http's timeout: a phase
	// sets it to have clients leave while their COMMIT waits.
	patience atomic.Int64
}

// send makes one attempt of in.
func (c *client) send(ctx context.Context, in intent) reply {
	if p := time.Duration(c.patience.Load()); p > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p)
		defer cancel()
	}
	path, body := "/v1/payments", fmt.Sprintf(`{"amount":%d,"currency":"usd","metadata":{"intent":%q}}`, in.amount, in.key)
	if in.paymentID != "" {
		path, body = "/v1/payments/"+in.paymentID+"/refunds", fmt.Sprintf(`{"amount":%d}`, in.amount)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base()+path, strings.NewReader(body))
	if err != nil {
		panic(err) // the URL and method are ours
	}
	req.Header.Set("Authorization", "Bearer "+in.secret)
	req.Header.Set("Idempotency-Key", in.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return reply{}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}
	}
	r := reply{status: resp.StatusCode, reqID: resp.Header.Get("X-Request-Id"), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	var doc struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &doc) // a body that is not JSON leaves both empty
	r.id = doc.ID
	if i := strings.LastIndex(doc.Type, "/"); i >= 0 {
		r.problem = doc.Type[i+1:]
	}
	return r
}

// phaseStats counts what happened in one phase: the faults injected while
// it was active, and the intents begun meanwhile, followed to their end with
// every attempt and reply (clients finish their intents before the next
// phase begins).
type phaseStats struct {
	Name   string `json:"name"`
	Faults int    `json:"faults_injected"`
	// CommitsGivenUp are COMMITs without a fault whose request's time ran
	// out (or whose connection was cut) before the server's reply came
	// (faultproxy.Proxy.CommitsGivenUp): on a busy machine a request that
	// waited for a connection can reach its COMMIT with little time left.
	// Those are answered outcome-unknown too, and rightly.
	CommitsGivenUp int            `json:"commits_given_up"`
	Intents        int            `json:"intents"`
	Attempts       int            `json:"attempts"`
	Replies        map[string]int `json:"replies"`
	// LongestIntent is the longest time from an intent's first attempt to
	// its final answer, for intents begun in this phase.
	LongestIntent time.Duration `json:"longest_intent_ns"`
	// Intents first answered outcome-unknown in this phase, by what the
	// same key found on retry: a replay (it had committed) or nothing (it
	// had not, so the retry executed it once).
	UnknownThenReplayed int `json:"unknown_then_replayed"`
	UnknownThenExecuted int `json:"unknown_then_executed"`
	// LongestWithoutSuccess is the longest time in the phase with no
	// client getting a payment's 201: how long the fault kept payments
	// from being taken, as clients saw it. (A refund may wait longer, for
	// its payment's charge.)
	LongestWithoutSuccess time.Duration `json:"longest_without_201_ns"`
	// NoPrimary, in the failover mode, is the longest time in the phase
	// that a new connection found no primary to write to.
	NoPrimary time.Duration `json:"no_primary_ns,omitempty"`
	// Broken names the invariants that did not hold after the phase.
	Broken []string `json:"invariants_broken"`
}

// ledger is what the clients were told, for checking against the database.
type ledger struct {
	mu       sync.Mutex
	phase    int
	phases   []*phaseStats
	payments map[string]int64 // acknowledged payment id -> amount
	// ids are the same ids by the API key they were made with, for
	// choosing one of the tenant's own to refund: a client is one tenant's,
	// so a node lost holds back only the clients of the tenants it holds.
	ids     map[string][]string
	refunds map[string]bool // acknowledged refund ids
	// acked are the intents answered 201, with the id they were told, to
	// send again at the end (resend); intentOf maps a payment id to its
	// intent's key.
	acked    []ackedIntent
	intentOf map[string]string
	// lastSuccess is when a client last got a payment's 201.
	lastSuccess time.Time
	// reexecuted counts acknowledged intents that, sent again with their
	// key, were not replayed: they executed a second time.
	reexecuted int
	// lostCharged counts acknowledged payments missing from the database
	// that the processor had charged.
	lostCharged int
	// idKeyedTwice counts intents a key per payment id would have charged
	// twice (Results.IDKeyedTwice).
	idKeyedTwice int
	// noEffect holds the request ids of attempts answered "no effect".
	noEffect map[string]bool
	// unresolved intents: no final answer within the intent deadline.
	unresolved   int
	serverErrors int // 500s
	unknown      int // outcome-unknown answers
	// unknownIntents met at least one of them.
	unknownIntents int
	// Intents that met an unknown outcome, by how the same key resolved it:
	// a replay (the attempt had committed) or an execution (it had not).
	UnknownCommitted, UnknownNotCommitted int
}

func newLedger(names []string) *ledger {
	l := &ledger{payments: map[string]int64{}, refunds: map[string]bool{}, noEffect: map[string]bool{},
		intentOf: map[string]string{}, ids: map[string][]string{}, lastSuccess: time.Now()}
	for _, n := range names {
		l.phases = append(l.phases, &phaseStats{Name: n, Replies: map[string]int{}})
	}
	return l
}

func (l *ledger) setPhase(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phase = i
	l.lastSuccess = time.Now()
}

func (l *ledger) addFaults(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phases[l.phase].Faults += n
}

// next makes a new intent for the tenant whose API key is secret: mostly
// payments, and a refund of one of its acknowledged payments a quarter of
// the time. Refunds of up to half the amount make some payments run out,
// which exercises the stored 422.
func (l *ledger) next(rng *rand.Rand, paymentsOnly bool, secret string) intent {
	l.mu.Lock()
	defer l.mu.Unlock()
	in := intent{key: uuid.NewString(), secret: secret, amount: 100 + rng.Int64N(10_000), phase: l.phase}
	if ids := l.ids[secret]; !paymentsOnly && len(ids) > 0 && rng.IntN(4) == 0 {
		in.paymentID = ids[rng.IntN(len(ids))]
		in.amount = 1 + rng.Int64N(l.payments[in.paymentID]/2)
	}
	l.phases[l.phase].Intents++
	return in
}

func (l *ledger) record(in *intent, r reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.phases[l.phase]
	ps.Attempts++
	ps.Replies[r.label()]++
	if r.noEffect() && r.reqID != "" {
		l.noEffect[r.reqID] = true
	}
	switch {
	case r.status == http.StatusInternalServerError:
		l.serverErrors++
	case r.problem == "outcome-unknown":
		l.unknown++
		if !in.unknown {
			in.unknown, in.unknownPhase = true, l.phase
			l.unknownIntents++
		}
	}
	if r.final() && in.unknown {
		if r.replayed {
			l.UnknownCommitted++
			l.phases[in.unknownPhase].UnknownThenReplayed++
		} else {
			l.UnknownNotCommitted++
			l.phases[in.unknownPhase].UnknownThenExecuted++
		}
	}
	if r.status == http.StatusCreated {
		if in.paymentID == "" {
			now := time.Now()
			ps.LongestWithoutSuccess = max(ps.LongestWithoutSuccess, now.Sub(l.lastSuccess))
			l.lastSuccess = now
		}
		l.acked = append(l.acked, ackedIntent{in: *in, id: r.id}) // a 201 is final: once per intent
	}
	switch {
	case r.status == http.StatusCreated && in.paymentID == "":
		if _, seen := l.payments[r.id]; !seen {
			l.payments[r.id] = in.amount
			l.ids[in.secret] = append(l.ids[in.secret], r.id)
			l.intentOf[r.id] = in.key
		}
	case r.status == http.StatusCreated:
		l.refunds[r.id] = true
	}
}

// closePhase counts the time since the last payment's 201 into the phase's longest
// stretch without one, when the clients stop beginning intents. The time they
// then take to finish their last ones is not counted: those are mostly
// refunds waiting for their payment's charge, and no payment was refused in
// it. A payment answered after it still counts how long it waited (record).
func (l *ledger) closePhase() {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.phases[l.phase]
	ps.LongestWithoutSuccess = max(ps.LongestWithoutSuccess, time.Since(l.lastSuccess))
}

// ackedIntent is an intent a client was answered 201 for, and the id it was
// told.
type ackedIntent struct {
	in intent
	id string
}

// resend sends every acknowledged intent once more with its key, retrying
// what is not final, and counts those not replayed as they were
// acknowledged. A client whose 201 was lost on the way does exactly this,
// and the service promised it the same answer.
func resend(ctx context.Context, c *client, l *ledger, deadline time.Duration) {
	l.mu.Lock()
	acked := slices.Clone(l.acked)
	l.mu.Unlock()
	var (
		wg   sync.WaitGroup
		next = make(chan ackedIntent)
	)
	for range 16 {
		wg.Go(func() {
			for a := range next {
				start := time.Now()
				var r reply
				for time.Since(start) < deadline && ctx.Err() == nil {
					if r = c.send(ctx, a.in); r.final() || sleep(ctx, 100*time.Millisecond) != nil {
						break
					}
				}
				if r.status != http.StatusCreated || !r.replayed || r.id != a.id {
					l.mu.Lock()
					l.reexecuted++
					l.mu.Unlock()
				}
			}
		})
	}
	for _, a := range acked {
		next <- a
	}
	close(next)
	wg.Wait()
}

func (l *ledger) finish(in intent, took time.Duration, resolved bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !resolved {
		l.unresolved++
	}
	if ps := l.phases[in.phase]; took > ps.LongestIntent {
		ps.LongestIntent = took
	}
}

// work runs intents until stop is closed, each retried with its key until a
// final answer or the deadline. It retries faster than Retry-After asks (50 to
// 150 ms), to press the service harder than a polite client would.
//
// A paymentsOnly client makes payments alone: one that never waits on a
// refund's payment, whose answers time how long payments could not be taken.
// Its payments are for the tenant whose API key is secret.
func work(ctx context.Context, c *client, l *ledger, stop <-chan struct{}, deadline time.Duration, seed uint64, paymentsOnly bool, secret string) {
	rng := rand.New(rand.NewPCG(seed, seed))
	for {
		select {
		case <-stop:
			return
		default:
		}
		in := l.next(rng, paymentsOnly, secret)
		start := time.Now()
		resolved := false
		for time.Since(start) < deadline && ctx.Err() == nil {
			r := c.send(ctx, in)
			l.record(&in, r)
			if r.final() {
				resolved = true
				break
			}
			time.Sleep(time.Duration(50+rng.IntN(100)) * time.Millisecond)
		}
		l.finish(in, time.Since(start), resolved)
	}
}
