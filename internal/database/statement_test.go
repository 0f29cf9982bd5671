package database_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// Send runs the statements in order, in one transaction's round trip, and
// hands each its result; the first that fails stops the rest, so a caller's
// later statements (a response stored after a payment's insert) never run
// without the earlier ones.
func TestSendRunsStatementsInOrderAndStopsAtTheFirstFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.New(t, 2).OwnerURL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = conn.Exec(ctx, `CREATE TABLE sent (n int PRIMARY KEY)`)
	require.NoError(t, err)
	insert := func(n int, changed *int64) database.Statement {
		return database.Statement{SQL: `INSERT INTO sent VALUES ($1) ON CONFLICT DO NOTHING`, Args: []any{n}, Done: func(tag pgconn.CommandTag) error {
			*changed = tag.RowsAffected()
			return nil
		}}
	}

	var first, again, count int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return database.Send(ctx, tx,
			insert(1, &first),
			insert(1, &again),
			database.Statement{SQL: `SELECT count(*) FROM sent`, Row: func(row pgx.Row) error { return row.Scan(&count) }})
	})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 0, 1}, []int64{first, again, count}, "each result went to its own statement, in order")

	refused := errors.New("refused by Done")
	var after int64 = -1
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return database.Send(ctx, tx,
			database.Statement{SQL: `INSERT INTO sent VALUES (2)`, Done: func(pgconn.CommandTag) error { return refused }},
			insert(3, &after))
	})
	require.ErrorIs(t, err, refused)
	require.Equal(t, int64(-1), after, "nothing after the failure ran")
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM sent`).Scan(&count))
	require.Equal(t, int64(1), count, "the failed transaction left nothing")
}
