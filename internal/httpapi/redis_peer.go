//go:build benchmark

package httpapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// mountRedisPeer mounts POST /benchmark/payments-redis-claim: the same
// payment with its key claimed in Redis (SET NX PX) instead of in the
// payment's transaction, the design the failure lab's rows 3 and 5 break.
// The load test runs it beside POST /v1/payments, so what the difference
// buys (docs/lab.md) can be set against what it costs.
func (a *api) mountRedisPeer(r chi.Router, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	r.With(authenticate(a.pool, a.log), requireScope(auth.ScopePaymentsWrite, a.log)).
		Post("/benchmark/payments-redis-claim", func(w http.ResponseWriter, r *http.Request) { a.createPaymentRedisClaim(w, r, rdb) })
}

func (a *api) createPaymentRedisClaim(w http.ResponseWriter, r *http.Request, rdb *redis.Client) {
	var in payments.NewPayment
	req, err := a.parseIdempotent(w, r, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	ctx := r.Context()
	claim := RedisPeerKeyPrefix + req.Principal.String() + ":" + req.Key
	const inProgress = "in_progress"
	taken, err := rdb.SetNX(ctx, claim, inProgress, 25*time.Hour).Result()
	if err != nil {
		writeError(w, r, a.log, errors.Join(database.ErrUnavailable, err))
		return
	}
	if !taken {
		stored, err := rdb.Get(ctx, claim).Bytes()
		switch {
		case err != nil:
			writeError(w, r, a.log, errors.Join(database.ErrUnavailable, err))
		case string(stored) == inProgress:
			// A duplicate of a running original: unlike a row lock, a
			// Redis claim cannot be waited on, so it is a 409 at once.
			writeError(w, r, a.log, idempotency.ErrRequestInProgress)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			writeResponse(w, idempotency.Response{Status: http.StatusCreated, ContentType: "application/json", Body: stored})
		}
		return
	}
	var resp idempotency.Response
	err = database.InTenantTx(ctx, a.pool, req.Principal, database.TxOptions{}, func(tx pgx.Tx) error {
		pay, err := payments.Create(ctx, tx, a.outbox, req.Principal, in, a.livemode)
		if err != nil {
			return err
		}
		resp, err = renderJSON(http.StatusCreated, pay)
		return err
	})
	if err != nil {
		_ = rdb.Del(ctx, claim).Err() // a crash here instead leaves the claim: lab row 3
		writeError(w, r, a.log, err)
		return
	}
	if err := rdb.Set(ctx, claim, resp.Body, 25*time.Hour).Err(); err != nil {
		a.log.ErrorContext(ctx, "redis peer: store response", "error", err)
	}
	writeResponse(w, resp)
}
