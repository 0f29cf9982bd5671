package idempotency_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// Without a synchronous standby (this server has none), a replay of a live
// key is a read-only transaction: the claim's INSERT
// conflicts and does nothing, the stored row is read without a lock. With
// no transaction id there can be no row lock and nothing for COMMIT to
// flush, so a replay costs what a read costs. The check runs inside the
// replay's own transaction (Reauthorize is called there, after the claim
// and the lookup). With a standby it writes WAL, and waits like a write
// (TestAReplayWaitsForTheStandby in cmd/api).
func TestReplayIsReadOnly(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 2)
	ctx := context.Background()
	pool, err := database.Open(ctx, db.AppURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	exec, err := idempotency.NewExecutor(pool, idempotency.Config{Retention: 25 * time.Hour, LockTimeout: 5 * time.Second})
	require.NoError(t, err)

	req := idempotency.Request{
		Authenticate: newCaller(t, db),
		Scope:        idempotency.Scope{Endpoint: "POST /v1/payments", Key: "k"},
		Fingerprint:  idempotency.Fingerprint(http.MethodPost, "/v1/payments", []byte(`{}`)),
		RequestID:    "req_1",
	}
	executed := 0
	var xid *int64
	op := idempotency.Operation{
		Execute: func(context.Context, idempotency.Work) (idempotency.Outcome, error) {
			executed++
			return idempotency.Outcome{Response: idempotency.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"ok":true}`)}}, nil
		},
		Reauthorize: func(ctx context.Context, tx pgx.Tx, _ uuid.UUID) error {
			return tx.QueryRow(ctx, `SELECT txid_current_if_assigned()`).Scan(&xid)
		},
	}
	first, err := exec.Do(ctx, req, op)
	require.NoError(t, err)
	require.False(t, first.Replayed)

	req.RequestID = "req_2"
	again, err := exec.Do(ctx, req, op)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Response, again.Response)
	require.Equal(t, 1, executed)
	require.Nil(t, xid, "the replay's transaction got a transaction id: it locked or wrote a row")
}

// newCaller creates a principal with a payments:write key and returns the
// Request.Authenticate that presents it.
func newCaller(t *testing.T, db testdb.DB) func() (database.Statement, *uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.OwnerURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var key auth.NewKey
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
		key, err = auth.CreateKey(ctx, tx, "executor-test", []string{auth.ScopePaymentsWrite})
		return err
	}))
	creds, err := auth.ParseCredentials("Bearer " + key.Secret)
	require.NoError(t, err)
	return func() (database.Statement, *uuid.UUID) {
		var p auth.Principal
		return creds.Authentication(auth.ScopePaymentsWrite, &p), &p.ID
	}
}
