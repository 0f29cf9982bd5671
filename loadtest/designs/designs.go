// Package designs holds what the load test measures beside the service, in
// its own server (loadtest/server), never in the production binary: the same
// payment write without idempotency (the baseline) and with its key claimed
// in Redis instead of PostgreSQL (the peer), and the timing of each request's
// claim statement, sent back as Server-Timing.
package designs

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/app"
	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// Paths of the two designs.
const (
	BaselinePath = "/benchmark/payments-without-idempotency"
	PeerPath     = "/benchmark/payments-redis-claim"
)

// PeerKeyPrefix begins every key the peer design writes, so the load test can
// remove them after its run.
const PeerKeyPrefix = "payments-peer-claim:"

// Routes mounts the baseline, and the peer when rdb is not nil. Serve mounts
// them behind the API's own middleware and authentication, so each is
// measured through the same stack as POST /v1/payments.
func Routes(rdb *redis.Client) func(chi.Router, app.Deps) {
	return func(r chi.Router, d app.Deps) {
		r.Post(BaselinePath, func(w http.ResponseWriter, r *http.Request) { baseline(w, r, d) })
		if rdb != nil {
			r.Post(PeerPath, func(w http.ResponseWriter, r *http.Request) { peer(w, r, d, rdb) })
		}
	}
}

// baseline is POST /v1/payments minus the key: no claim, no stored response.
func baseline(w http.ResponseWriter, r *http.Request, d app.Deps) {
	p, in, ok := parse(w, r)
	if !ok {
		return
	}
	body, err := create(r.Context(), d, p, in)
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	reply(w, body)
}

// peer claims the key in Redis (SET NX PX) outside the payment's
// transaction: the design the failure lab's rows 3 and 5 break, measured here
// for what the difference costs.
func peer(w http.ResponseWriter, r *http.Request, d app.Deps, rdb *redis.Client) {
	p, in, ok := parse(w, r)
	if !ok {
		return
	}
	key, err := idempotency.ParseKey(r.Header.Get("Idempotency-Key"))
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	ctx := r.Context()
	claim := PeerKeyPrefix + p.ID.String() + ":" + key
	const inProgress = "in_progress"
	taken, err := rdb.SetNX(ctx, claim, inProgress, 25*time.Hour).Result()
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	if !taken {
		stored, err := rdb.Get(ctx, claim).Bytes()
		switch {
		case err != nil:
			fail(w, http.StatusServiceUnavailable, err)
		case string(stored) == inProgress:
			// Unlike a row lock, a Redis claim cannot be waited on.
			fail(w, http.StatusConflict, idempotency.ErrRequestInProgress)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			reply(w, stored)
		}
		return
	}
	body, err := create(ctx, d, p, in)
	if err != nil {
		_ = rdb.Del(ctx, claim).Err() // a crash here instead leaves the claim: lab row 3
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	if err := rdb.Set(ctx, claim, body, 25*time.Hour).Err(); err != nil {
		d.Logger.ErrorContext(ctx, "redis peer: store response", "error", err)
	}
	reply(w, body)
}

func parse(w http.ResponseWriter, r *http.Request) (auth.Principal, payments.NewPayment, bool) {
	var in payments.NewPayment
	p, _ := auth.FromContext(r.Context())
	if !p.Can(auth.ScopePaymentsWrite) {
		fail(w, http.StatusForbidden, auth.ErrForbidden)
		return p, in, false
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&in); err != nil {
		fail(w, http.StatusBadRequest, err)
		return p, in, false
	}
	if err := in.Validate(); err != nil {
		fail(w, http.StatusBadRequest, err)
		return p, in, false
	}
	return p, in, true
}

// create writes the payment and its charge job, as POST /v1/payments does.
func create(ctx context.Context, d app.Deps, p auth.Principal, in payments.NewPayment) ([]byte, error) {
	var body []byte
	err := database.InTenantTx(ctx, d.Pool, p.ID, database.TxOptions{}, func(tx pgx.Tx) error {
		pay, err := payments.Create(ctx, tx, d.Outbox, p.ID, in, d.Livemode)
		if err != nil {
			return err
		}
		body, err = json.Marshal(pay)
		return err
	})
	return body, err
}

func reply(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// fail answers a problem document with only what the load test counts.
func fail(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "title": http.StatusText(status), "detail": err.Error()})
}

// ClaimTiming sends back, as "Server-Timing: claim;dur=<ms>", how long each
// request's claim statement took, waits for a concurrent duplicate included:
// the load test's per-request claim latency. Wrap is Options.WrapTracer,
// Middleware is Options.Middleware.
type ClaimTiming struct{}

type timingKey struct{}

type claimStart struct{}

// Wrap times the claim statement (INSERT ... ON CONFLICT (principal_id,
// endpoint, key) DO NOTHING) of each request.
func (ClaimTiming) Wrap(next pgx.QueryTracer) pgx.QueryTracer { return claimTracer{next} }

type claimTracer struct{ pgx.QueryTracer }

func (c claimTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	ctx = c.QueryTracer.TraceQueryStart(ctx, conn, data)
	if strings.Contains(data.SQL, "ON CONFLICT (principal_id, endpoint, key) DO NOTHING") {
		ctx = context.WithValue(ctx, claimStart{}, time.Now())
	}
	return ctx
}

func (c claimTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if start, ok := ctx.Value(claimStart{}).(time.Time); ok {
		if slot, ok := ctx.Value(timingKey{}).(*atomic.Int64); ok {
			slot.Store(int64(time.Since(start)))
		}
	}
	c.QueryTracer.TraceQueryEnd(ctx, conn, data)
}

// Middleware gives each request a slot for its claim time and sends it in
// Server-Timing when the response's header is written.
func (ClaimTiming) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slot := new(atomic.Int64)
		next.ServeHTTP(&timingWriter{ResponseWriter: w, slot: slot}, r.WithContext(context.WithValue(r.Context(), timingKey{}, slot)))
	})
}

type timingWriter struct {
	http.ResponseWriter
	slot  *atomic.Int64
	wrote bool
}

func (t *timingWriter) WriteHeader(status int) {
	if !t.wrote {
		t.wrote = true
		if d := time.Duration(t.slot.Load()); d > 0 {
			t.Header().Set("Server-Timing", "claim;dur="+strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 3, 64))
		}
	}
	t.ResponseWriter.WriteHeader(status)
}

func (t *timingWriter) Write(b []byte) (int, error) {
	if !t.wrote {
		t.WriteHeader(http.StatusOK)
	}
	return t.ResponseWriter.Write(b)
}
