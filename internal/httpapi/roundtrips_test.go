package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// roundTripCounter is a pgx tracer that counts the round trips the service
// pool makes: each statement sent on its own (BEGIN and COMMIT included),
// each batch (however many statements it carries: one round trip), and each
// explicit prepare. pgx also prepares a statement the first time a
// connection sees it, which no tracer hears: the test measures requests
// after that first one.
type roundTripCounter struct{ n atomic.Int64 }

func (c *roundTripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *roundTripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *roundTripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *roundTripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *roundTripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *roundTripCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *roundTripCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// Round trips per request, a count and not a timing (docs/performance.md):
// a new payment in at most 4 (BEGIN; authenticate + claim + lookup; payment
// + job + response; COMMIT), a replay in at most 3 (BEGIN; authenticate +
// claim + lookup; COMMIT). Each round trip is a wait for the server, and on
// a busy machine a trip through the scheduler; the targets are #23's.
func TestRoundTripsPerRequest(t *testing.T) {
	t.Parallel()
	counter := &roundTripCounter{}
	// One connection, so the first request of each kind has prepared its
	// statements for every later one; no workers, whose statements would
	// count too.
	b := setup(t, func(o *options) { o.maxConns, o.noWorkers, o.roundTrips = 1, true, counter })
	k := b.newKey(t, "trips", allScopes...)
	count := func(c call, status int) int64 {
		t.Helper()
		before := counter.n.Load()
		r := b.do(t, c)
		require.Equal(t, status, r.Status, "%s %s: %s", c.method, c.path, r.Body)
		return counter.n.Load() - before
	}
	pay := func(key string) call {
		return call{method: http.MethodPost, path: "/v1/payments", secret: k.Secret, key: key, body: `{"amount":1000,"currency":"usd"}`}
	}

	// Each kind twice, counting the second: the first has prepared its
	// statements on the connection (which the tracer partly hears).
	trips := map[string]int64{}
	twice := func(name string, c func(round int) call, status int, before func(round int)) {
		for round := range 2 {
			if before != nil {
				before(round)
			}
			trips[name] = count(c(round), status)
		}
	}
	keyed := func(prefix string) func(int) call {
		return func(round int) call { return pay(fmt.Sprintf("%s-%d", prefix, round)) }
	}
	twice("new payment", keyed("new"), http.StatusCreated, nil)
	twice("replay", keyed("new"), http.StatusCreated, nil)
	twice("late retry", keyed("new"), http.StatusCreated, func(round int) { b.expire(t, fmt.Sprintf("new-%d", round)) })
	twice("unknown secret, 401", func(int) call {
		return call{method: http.MethodPost, path: "/v1/payments", secret: "sk_unknown", key: "x", body: `{"amount":1000,"currency":"usd"}`}
	}, http.StatusUnauthorized, nil)
	twice("invalid field, 400", func(int) call {
		return call{method: http.MethodPost, path: "/v1/payments", secret: k.Secret, key: "y", body: `{"amount":-1,"currency":"usd"}`}
	}, http.StatusBadRequest, nil)
	twice("list payments", func(int) call { return call{method: http.MethodGet, path: "/v1/payments", secret: k.Secret} }, http.StatusOK, nil)
	twice("no Authorization, 401", func(int) call { return call{method: http.MethodPost, path: "/v1/payments", body: `{}`} }, http.StatusUnauthorized, nil)
	// A key this process has not authenticated before: its first request
	// authenticates in a round trip of its own, to learn the principal its
	// claim names (auth.KeyPrincipals); its later ones do not.
	fresh := b.newKey(t, "trips", allScopes...)
	for round, name := range []string{"first payment of a new key", "second payment of a new key"} {
		c := pay(fmt.Sprintf("fresh-%d", round))
		c.secret = fresh.Secret
		trips[name] = count(c, http.StatusCreated)
	}
	t.Logf("round trips per request: %v", trips)
	require.LessOrEqual(t, trips["new payment"], int64(4), "a new payment")
	require.LessOrEqual(t, trips["replay"], int64(3), "a replay")
	require.Equal(t, map[string]int64{
		"new payment": 4, "replay": 3, "late retry": 5, "unknown secret, 401": 3,
		"invalid field, 400": 3, "list payments": 4, "no Authorization, 401": 0,
		"first payment of a new key": 5, "second payment of a new key": 4,
	}, trips, "the documented counts (docs/performance.md) changed")
}
