package database

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A Statement is one SQL statement, its arguments and what reads its
// result, as a value. Domain packages return Statements rather than run
// them, so that the layer that owns a transaction decides its round trips:
// the idempotency executor sends a payment's writes in one with the
// response it stores, an outbox worker sends a settle in one with its job's
// completion (docs/performance.md). A domain package says once what to
// write, and never which round trip it travels in.
type Statement struct {
	SQL  string
	Args []any
	// Row reads the statement's one row; nil when its rows are not read.
	Row func(pgx.Row) error
	// Done reads what the statement did (how many rows it changed); nil
	// when that is not checked. A Statement has Row or Done, not both.
	Done func(pgconn.CommandTag) error
}

// Send runs stmts on db in one round trip, in order, calling each one's Row
// or Done as its result arrives. The first statement that fails, or whose
// Row or Done fails, gives the error; in a transaction, the statements
// after it do not run and the transaction is failed.
func Send(ctx context.Context, db DBTX, stmts ...Statement) error {
	b := &pgx.Batch{}
	for _, s := range stmts {
		q := b.Queue(s.SQL, s.Args...)
		switch {
		case s.Row != nil:
			q.QueryRow(s.Row)
		case s.Done != nil:
			q.Exec(s.Done)
		}
	}
	return db.SendBatch(ctx, b).Close()
}
