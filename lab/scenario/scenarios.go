package scenario

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/config"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// Scenarios is every scenario, in the order of docs/lab.md.
var Scenarios = []Scenario{
	{"key scoped by key alone", scopedByKeyAlone},
	{"written at completion, no claim first", writtenAtCompletion},
	{"claim in Redis, crash before the write", redisClaimThenCrash},
	{"keys in an in-process cache, two instances", inProcessCache},
	{"Redis allkeys-lru under memory pressure", redisEviction},
	{"TTL shorter than the retry horizon", shortTTL},
	{"expiry without an index", expiryWithoutIndex},
	{"one unbounded DELETE", unboundedDelete},
	{"no fingerprint", noFingerprint},
	{"no re-authorization on replay", noReauthorization},
	{"uncapped stored responses", uncappedResponses},
}

const window = 25 * time.Hour

// 1. Tenant B sends the key tenant A used: a table keyed by the key alone
// answers B with A's payment.
func scopedByKeyAlone(ctx context.Context, l *Lab) (Outcome, error) {
	key := l.key("retry-1")
	aPayment, err := l.naivePay(ctx, "A", key)
	if err != nil {
		return Outcome{}, err
	}
	if _, err := l.admin.Exec(ctx, `INSERT INTO lab_naive_keys (key, response) VALUES ($1, $2)`, key, aPayment); err != nil {
		return Outcome{}, err
	}
	var toB string // the naive lookup for B's request
	if err := l.admin.QueryRow(ctx, `SELECT response FROM lab_naive_keys WHERE key = $1`, key).Scan(&toB); err != nil {
		return Outcome{}, err
	}

	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	a, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	b, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	ra, err := l.pay(ctx, e, a, key, 1000)
	if err != nil {
		return Outcome{}, err
	}
	rb, err := l.pay(ctx, e, b, key, 1000)
	if err != nil {
		return Outcome{}, err
	}
	leaked := string(ra.Response.Body) == string(rb.Response.Body)
	return Outcome{
		Naive:      verdict(toB == aPayment, "B received A's payment", "B got its own"),
		Ours:       verdict(!leaked && !rb.Replayed, "B's payment executed for B; A's stays A's", "B received A's payment"),
		NaiveBroke: toB == aPayment,
		OursHeld:   !leaked && !rb.Replayed,
		Shown:      "naive: " + verdict(toB == aPayment, "B got A's payment", "B got its own") + "; ours: " + verdict(leaked, "B got A's payment", "B got its own"),
	}, nil
}

// 2. Concurrent retries of one key, each checking for a stored response and
// storing it after the payment: several pass the check before any stores.
func writtenAtCompletion(ctx context.Context, l *Lab) (Outcome, error) {
	n := l.env.Concurrency
	naiveKey, ourKey := l.key("completion-naive"), l.key("completion-ours")
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	start := make(chan struct{})
	// The naive race is staged, not left to the scheduler: every retry has
	// looked and found nothing before any of them writes, which is what
	// happens whenever the retries overlap. (Left to timing, a small pool
	// can serialize them into one payment and hide the flaw.)
	var looked sync.WaitGroup
	looked.Add(n)
	for range n {
		wg.Go(func() {
			<-start
			var stored string
			err := l.admin.QueryRow(ctx, `SELECT response FROM lab_naive_keys WHERE key = $1`, naiveKey).Scan(&stored)
			looked.Done()
			if !errors.Is(err, pgx.ErrNoRows) {
				errs <- err
				return
			}
			looked.Wait()
			id, err := l.naivePay(ctx, "A", naiveKey)
			if err == nil {
				_, err = l.admin.Exec(ctx, `INSERT INTO lab_naive_keys (key, response) VALUES ($1, $2) ON CONFLICT DO NOTHING`, naiveKey, id)
			}
			errs <- err
		})
	}
	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	for range n {
		wg.Go(func() {
			<-start
			_, err := l.pay(ctx, e, principal, ourKey, 1000)
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return Outcome{}, err
		}
	}
	naive, err := l.naivePayments(ctx, naiveKey)
	if err != nil {
		return Outcome{}, err
	}
	ours, err := l.ourPayments(ctx, ourKey)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      fmt.Sprintf("%s concurrent retries made %s payments", num(n), num(naive)),
		Ours:       fmt.Sprintf("%s concurrent retries made %s payment", num(n), num(ours)),
		NaiveBroke: naive > 1, OursHeld: ours == 1,
		Shown: fmt.Sprintf("naive: %s payments; ours: %s", num(naive), num(ours)),
	}, nil
}

// 3. The claim is taken in Redis (SET NX) and marked done before the
// payment is written to PostgreSQL; the process dies in between. The
// retry finds the claim and answers success for a payment that does not
// exist.
func redisClaimThenCrash(ctx context.Context, l *Lab) (Outcome, error) {
	naiveKey, ourKey := l.key("redis-crash-naive"), l.key("redis-crash-ours")
	if err := l.redis.SetNX(ctx, "lab:claim:"+naiveKey, "done", time.Hour).Err(); err != nil {
		return Outcome{}, err
	}
	// ... the process dies here, before the PostgreSQL write.
	taken, err := l.redis.SetNX(ctx, "lab:claim:"+naiveKey, "done", time.Hour).Result()
	if err != nil {
		return Outcome{}, err
	}
	toldSuccess := !taken // the retry finds the claim "done" and answers success
	naive, err := l.naivePayments(ctx, naiveKey)
	if err != nil {
		return Outcome{}, err
	}

	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	body := []byte(`{"amount":1000,"currency":"usd"}`)
	req := idempotency.Request{
		Authenticate: principal.authenticate,
		Scope:        idempotency.Scope{Endpoint: "POST /v1/payments", Key: ourKey},
		Fingerprint:  idempotency.Fingerprint("POST", "/v1/payments", body),
		RequestID:    "req_crash",
	}
	errCrash := errors.New("the process died after the claim")
	_, err = e.Do(ctx, req, idempotency.Operation{Execute: func(context.Context, idempotency.Work) (idempotency.Outcome, error) {
		return idempotency.Outcome{}, errCrash // the claim's transaction dies with it
	}})
	if !errors.Is(err, errCrash) {
		return Outcome{}, fmt.Errorf("ours: want the crash, got %v", err)
	}
	retry, err := l.pay(ctx, e, principal, ourKey, 1000)
	if err != nil {
		return Outcome{}, err
	}
	ours, err := l.ourPayments(ctx, ourKey)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      fmt.Sprintf("retry told success; payments: %s", num(naive)),
		Ours:       fmt.Sprintf("claim rolled back with the crash; retry executed (replayed: %v); payments: %s", retry.Replayed, num(ours)),
		Shown:      fmt.Sprintf("naive: %s payments, retry told success; ours: %s", num(naive), num(ours)),
		NaiveBroke: toldSuccess && naive == 0,
		OursHeld:   !retry.Replayed && ours == 1,
	}, nil
}

// 4. Each instance remembers keys in its own memory: the retry that a load
// balancer sends to the other instance executes again.
func inProcessCache(ctx context.Context, l *Lab) (Outcome, error) {
	naiveKey, ourKey := l.key("cache-naive"), l.key("cache-ours")
	instances := []map[string]string{{}, {}}
	for _, cache := range instances { // the first attempt, then the retry
		if _, seen := cache[naiveKey]; !seen {
			id, err := l.naivePay(ctx, "A", naiveKey)
			if err != nil {
				return Outcome{}, err
			}
			cache[naiveKey] = id
		}
	}
	naive, err := l.naivePayments(ctx, naiveKey)
	if err != nil {
		return Outcome{}, err
	}

	// Ours: two executors, as two instances have, over one database.
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	var replayed bool
	for range 2 {
		e, err := l.executor(window, 64<<10)
		if err != nil {
			return Outcome{}, err
		}
		r, err := l.pay(ctx, e, principal, ourKey, 1000)
		if err != nil {
			return Outcome{}, err
		}
		replayed = r.Replayed
	}
	ours, err := l.ourPayments(ctx, ourKey)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      fmt.Sprintf("the retry on the second instance executed again: %s payments", num(naive)),
		Ours:       fmt.Sprintf("the second instance replayed (%v): %s payment", replayed, num(ours)),
		Shown:      fmt.Sprintf("naive: %s payments; ours: %s", num(naive), num(ours)),
		NaiveBroke: naive > 1, OursHeld: replayed && ours == 1,
	}, nil
}

// 6. Keys kept for less time than clients retry: a late retry finds no key
// and executes again, silently.
func shortTTL(ctx context.Context, l *Lab) (Outcome, error) {
	naiveKey, ourKey := l.key("ttl-naive"), l.key("ttl-ours")
	const ttl, retryAfter = 500 * time.Millisecond, time.Second
	attempt := func() error {
		var stored string
		err := l.admin.QueryRow(ctx, `SELECT response FROM lab_naive_keys WHERE key = $1 AND expires_at > now()`, naiveKey).Scan(&stored)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		id, err := l.naivePay(ctx, "A", naiveKey)
		if err != nil {
			return err
		}
		_, err = l.admin.Exec(ctx, `INSERT INTO lab_naive_keys (key, response, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')
			ON CONFLICT (key) DO UPDATE SET response = EXCLUDED.response, expires_at = EXCLUDED.expires_at`, naiveKey, id, ttl.Milliseconds())
		return err
	}
	if err := attempt(); err != nil {
		return Outcome{}, err
	}

	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	if _, err := l.pay(ctx, e, principal, ourKey, 1000); err != nil {
		return Outcome{}, err
	}
	time.Sleep(retryAfter)
	if err := attempt(); err != nil {
		return Outcome{}, err
	}
	retry, err := l.pay(ctx, e, principal, ourKey, 1000)
	if err != nil {
		return Outcome{}, err
	}
	naive, err := l.naivePayments(ctx, naiveKey)
	if err != nil {
		return Outcome{}, err
	}
	ours, err := l.ourPayments(ctx, ourKey)
	if err != nil {
		return Outcome{}, err
	}
	// And the service refuses to run with a window shorter than it publishes.
	_, cfgErr := config.Load(func(k string) string {
		if k == "IDEMPOTENCY_WINDOW" {
			return "1m"
		}
		return ""
	})
	refused := cfgErr != nil && strings.Contains(cfgErr.Error(), "IDEMPOTENCY_WINDOW")
	return Outcome{
		Naive:      fmt.Sprintf("TTL %s, retry after %s: %s payments, no error", ttl, retryAfter, num(naive)),
		Ours:       fmt.Sprintf("window 24 h published and enforced (a 1 m window refused: %v); the retry replayed: %s payment", refused, num(ours)),
		Shown:      fmt.Sprintf("naive: %s payments; ours: %s", num(naive), num(ours)),
		NaiveBroke: naive > 1, OursHeld: retry.Replayed && ours == 1 && refused,
	}, nil
}

// 9. No fingerprint: the same key with another body replays the first
// response, and the client believes its second request was done.
func noFingerprint(ctx context.Context, l *Lab) (Outcome, error) {
	naiveKey, ourKey := l.key("fingerprint-naive"), l.key("fingerprint-ours")
	first, err := l.naivePay(ctx, "A", naiveKey+" amount 1000")
	if err != nil {
		return Outcome{}, err
	}
	if _, err := l.admin.Exec(ctx, `INSERT INTO lab_naive_keys (key, response) VALUES ($1, $2)`, naiveKey, first); err != nil {
		return Outcome{}, err
	}
	var toSecond string // the request for amount 2000 looks up the key only
	if err := l.admin.QueryRow(ctx, `SELECT response FROM lab_naive_keys WHERE key = $1`, naiveKey).Scan(&toSecond); err != nil {
		return Outcome{}, err
	}

	e, err := l.executor(window, 64<<10)
	if err != nil {
		return Outcome{}, err
	}
	principal, err := l.newCaller(ctx)
	if err != nil {
		return Outcome{}, err
	}
	if _, err := l.pay(ctx, e, principal, ourKey, 1000); err != nil {
		return Outcome{}, err
	}
	_, err = l.pay(ctx, e, principal, ourKey, 2000)
	refused := errors.Is(err, idempotency.ErrKeyReused)
	if err != nil && !refused {
		return Outcome{}, err
	}
	return Outcome{
		Naive:      "the request for 2,000 got the response of the 1,000 payment",
		Ours:       verdict(refused, "the request for 2,000 was refused (422 idempotency-key-reused); nothing executed", "the request for 2,000 was answered"),
		NaiveBroke: toSecond == first,
		OursHeld:   refused,
		Shown:      "naive: " + verdict(toSecond == first, "the request for 2,000 told it was done", "the request for 2,000 not answered") + "; ours: " + verdict(refused, "refused", "answered"),
	}, nil
}

func verdict(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}
