// Package designs holds what the load test measures beside the service, in
// its own server (loadtest/server), never in the production binary. Both
// designs are the service's own handlers (httpapi.New, the same middleware,
// parsing, validation and payment write) with one part swapped: the baseline
// has no key store at all, and the peer keeps its keys in Redis (SET NX PX)
// outside the payment's transaction. So a ratio against either measures the
// store and nothing else. It also times each request's claim statement and
// sends it back as Server-Timing.
package designs

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/httpapi"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// Paths of the two designs. Each is POST /v1/payments with its store swapped.
const (
	BaselinePath = "/benchmark/payments-without-idempotency"
	PeerPath     = "/benchmark/payments-redis-claim"
)

// PeerKeyPrefix begins every key the peer design writes, so the load test can
// remove them after its run.
const PeerKeyPrefix = "payments-peer-claim:"

// Handler is app.Options.Handler: it serves the baseline at BaselinePath, the
// peer at PeerPath when rdb is not nil, and the service everywhere else, all
// with the claim's Server-Timing.
func Handler(rdb *redis.Client) func(http.Handler, httpapi.Deps) http.Handler {
	return func(service http.Handler, d httpapi.Deps) http.Handler {
		routes := map[string]http.Handler{}
		baseline := d
		baseline.Idempotency = noStore{d.Pool}
		routes[BaselinePath] = httpapi.New(baseline)
		if rdb != nil {
			peer := d
			peer.Idempotency = redisStore{pool: d.Pool, rdb: rdb}
			routes[PeerPath] = httpapi.New(peer)
		}
		return claimTiming(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h, ok := routes[r.URL.Path]
			if !ok {
				service.ServeHTTP(w, r)
				return
			}
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/v1/payments"
			h.ServeHTTP(w, r2)
		}))
	}
}

// noStore runs the operation in a tenant transaction and answers: no claim,
// no stored response, no replay. The baseline.
type noStore struct{ pool *database.Pool }

func (s noStore) Do(ctx context.Context, req idempotency.Request, op idempotency.Operation) (idempotency.Result, error) {
	var res idempotency.Result
	err := database.InTx(ctx, s.pool, database.TxOptions{}, func(tx pgx.Tx) error {
		// The service's round trips less the key's: authenticate (and
		// read now(), which the claim would have returned), then the
		// payment's writes, without the response.
		authenticate, principal := req.Authenticate()
		var now time.Time
		clock := database.Statement{SQL: `SELECT now()`, Row: func(row pgx.Row) error { return row.Scan(&now) }}
		if err := database.Send(ctx, tx, authenticate, clock); err != nil {
			return err
		}
		out, err := op.Execute(ctx, idempotency.Work{Tx: tx, Now: now, Principal: *principal})
		if err != nil {
			return err
		}
		res.Response, res.OriginalRequestID = out.Response, req.RequestID
		return database.Send(ctx, tx, out.Writes...)
	})
	return res, err
}

// redisStore claims the key in Redis before the payment's transaction and
// stores the response there after it commits: the design the failure lab's
// rows 3 and 5 break, measured here for what the difference costs.
type redisStore struct {
	pool *database.Pool
	rdb  *redis.Client
}

func (s redisStore) Do(ctx context.Context, req idempotency.Request, op idempotency.Operation) (idempotency.Result, error) {
	// The claim is scoped by principal, so the caller is authenticated
	// first, in a round trip of its own: unlike ours, this claim cannot
	// ride in the payment's transaction.
	principal, err := s.authenticate(ctx, req)
	if err != nil {
		return idempotency.Result{}, err
	}
	claim := PeerKeyPrefix + principal.String() + ":" + req.Key
	const inProgress = "in_progress"
	taken, err := s.rdb.SetNX(ctx, claim, inProgress, 25*time.Hour).Result()
	if err != nil {
		return idempotency.Result{}, errors.Join(database.ErrUnavailable, err)
	}
	if !taken {
		stored, err := s.rdb.Get(ctx, claim).Bytes()
		switch {
		case err != nil:
			return idempotency.Result{}, errors.Join(database.ErrUnavailable, err)
		case string(stored) == inProgress:
			// Unlike a row lock, a Redis claim cannot be waited on.
			return idempotency.Result{}, idempotency.ErrRequestInProgress
		}
		return idempotency.Result{Replayed: true, Response: idempotency.Response{Status: http.StatusCreated, ContentType: "application/json", Body: stored}}, nil
	}
	res, err := noStore{s.pool}.Do(ctx, req, op)
	if err != nil {
		_ = s.rdb.Del(ctx, claim).Err() // a crash here instead leaves the claim: lab row 3
		return res, err
	}
	// A failure here loses the stored response, and a retry then pays twice:
	// the peer's weakness, not hidden.
	_ = s.rdb.Set(ctx, claim, res.Body, 25*time.Hour).Err()
	return res, nil
}

// authenticate runs req's authentication alone, outside any transaction.
func (s redisStore) authenticate(ctx context.Context, req idempotency.Request) (uuid.UUID, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return uuid.UUID{}, err
	}
	defer conn.Release()
	authenticate, principal := req.Authenticate()
	if err := database.Send(ctx, conn, authenticate); err != nil {
		return uuid.UUID{}, database.Classify(err)
	}
	return *principal, nil
}

type timingKey struct{}

type claimStart struct{}

// WrapTracer is app.Options.WrapTracer: it times the round trip that
// carries the claim statement (INSERT ... ON CONFLICT (principal_id,
// endpoint, key) DO NOTHING) of each request, with the authentication and
// the lookup sent with it, waits for a concurrent duplicate included.
func WrapTracer(next pgx.QueryTracer) pgx.QueryTracer { return claimTracer{next} }

type claimTracer struct{ pgx.QueryTracer }

const claimMarker = "ON CONFLICT (principal_id, endpoint, key) DO NOTHING"

// TraceBatchStart implements pgx.BatchTracer: the claim travels in a batch.
func (c claimTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if bt, ok := c.QueryTracer.(pgx.BatchTracer); ok {
		ctx = bt.TraceBatchStart(ctx, conn, data)
	}
	if data.Batch != nil {
		for _, q := range data.Batch.QueuedQueries {
			if strings.Contains(q.SQL, claimMarker) {
				return context.WithValue(ctx, claimStart{}, time.Now())
			}
		}
	}
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c claimTracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if bt, ok := c.QueryTracer.(pgx.BatchTracer); ok {
		bt.TraceBatchQuery(ctx, conn, data)
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c claimTracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	c.record(ctx)
	if bt, ok := c.QueryTracer.(pgx.BatchTracer); ok {
		bt.TraceBatchEnd(ctx, conn, data)
	}
}

// record stores the claim's time in the request's slot.
func (c claimTracer) record(ctx context.Context) {
	if start, ok := ctx.Value(claimStart{}).(time.Time); ok {
		if slot, ok := ctx.Value(timingKey{}).(*atomic.Int64); ok {
			slot.Store(int64(time.Since(start)))
		}
	}
}

func (c claimTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	ctx = c.QueryTracer.TraceQueryStart(ctx, conn, data)
	if strings.Contains(data.SQL, claimMarker) {
		ctx = context.WithValue(ctx, claimStart{}, time.Now())
	}
	return ctx
}

func (c claimTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	c.record(ctx)
	c.QueryTracer.TraceQueryEnd(ctx, conn, data)
}

// claimTiming gives each request a slot for its claim time and sends it as
// "Server-Timing: claim;dur=<ms>" when the response's header is written.
func claimTiming(next http.Handler) http.Handler {
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
