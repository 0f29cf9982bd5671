// Package database opens connection pools, applies migrations and runs
// per-request transactions with the tenant set for row-level security.
//
// It is the one place where a request's transaction begins and ends, and the
// one place where driver errors that mean "the database cannot serve you now"
// become ErrUnavailable.
package database

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// ErrUnavailable means the database could not serve the request in time: no
// pooled connection was free, the server could not be reached or is shutting
// down, or a lock could not be had in time. The request had no effect and can
// be retried.
var ErrUnavailable = errors.New("database unavailable")

// ErrOutcomeUnknown means COMMIT was sent but no answer came back: the
// connection was lost or the request's time ran out while the server was
// committing. The transaction may have committed or not, and nothing on this
// side can tell. A client must retry with the same idempotency key, which
// replays the outcome if there was one and executes once if there was not;
// retrying with a new key could execute twice.
var ErrOutcomeUnknown = errors.New("transaction outcome unknown: the connection was lost while committing")

// PoolConfig bounds a pool. Every field must be set.
type PoolConfig struct {
	// MaxConns is the pool size. Requests that wait for a concurrent duplicate
	// hold a connection while they wait, so size it for waiting duplicates too.
	MaxConns int32
	// AcquireTimeout bounds how long a request waits for a free connection.
	AcquireTimeout time.Duration
	// Tracer, when set, traces every statement (otelpgx in production).
	Tracer pgx.QueryTracer
	// IdleInTxTimeout, when positive, makes the server end a session whose
	// transaction has been idle this long. A request's transaction is never
	// idle for more than the moments between its statements, so this only
	// ever ends a transaction whose client has vanished, typically behind a
	// half-open connection: without it that transaction holds its key's row
	// lock until TCP gives up, hours later.
	IdleInTxTimeout time.Duration
	// CommitTimeout bounds a COMMIT (3 s when zero). A COMMIT runs with a
	// context of its own that the request cannot cancel: cancelled while
	// it waits for a synchronous standby, it would be committed on the
	// primary only, and lost by a failover. Keep it below the 5 s the HTTP
	// server allows past REQUEST_TIMEOUT for writing the response, so that
	// a COMMIT begun at the request's deadline is still answered (503
	// outcome-unknown at worst), not cut off.
	CommitTimeout time.Duration
	// MeterProvider, when set, counts the COMMITs whose outcome is unknown
	// (db_commit_outcome_unknown_total).
	MeterProvider metric.MeterProvider
}

// Server-side TCP settings for every session, so PostgreSQL notices a peer
// that vanished: an idle session in about 10+3*5 = 25 s (keepalives), one
// blocked sending to it in 30 s (tcp_user_timeout). The client side uses the
// same keepalives. They bound what idle_in_transaction_session_timeout does
// not: a session the server is writing to, or one outside a transaction.
var serverTCPParams = map[string]string{
	"tcp_keepalives_idle":     "10",
	"tcp_keepalives_interval": "5",
	"tcp_keepalives_count":    "3",
	"tcp_user_timeout":        "30000", // milliseconds
}

// Pool is a pgx pool whose every use waits a bounded time for a connection.
// It does not expose pgxpool's Query methods, which wait for a connection as
// long as the context allows.
type Pool struct {
	pool           *pgxpool.Pool
	acquireTimeout time.Duration
	commitTimeout  time.Duration
	unknown        metric.Int64Counter
	// syncRepCancelled holds the connections (*pgconn.PgConn) that heard
	// PostgreSQL's warning that a COMMIT's wait for the synchronous standby
	// was cancelled: committed here, perhaps not on the standby.
	syncRepCancelled sync.Map
}

// syncRepWarning begins the WARNING a COMMIT gets when its wait for a
// synchronous standby is cancelled (a cancel request, a statement timeout):
// "The transaction has already committed locally, but might not have been
// replicated to the standby."
const syncRepWarning = "canceling wait for synchronous replication"

// Open creates a pool. It does not connect: the first request does, so the
// service starts (and answers /healthz) while the database is down.
func Open(ctx context.Context, url string, cfg PoolConfig) (*Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	if cfg.Tracer != nil {
		pc.ConnConfig.Tracer = cfg.Tracer
	}
	// Settings in the URL win: an operator may know better for their network.
	params := pc.ConnConfig.RuntimeParams
	for k, v := range serverTCPParams {
		if _, set := params[k]; !set {
			params[k] = v
		}
	}
	if _, set := params["idle_in_transaction_session_timeout"]; !set && cfg.IdleInTxTimeout > 0 {
		params["idle_in_transaction_session_timeout"] = strconv.FormatInt(cfg.IdleInTxTimeout.Milliseconds(), 10)
	}
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}
	pc.ConnConfig.DialFunc = dialer.DialContext
	// Without a connect timeout a request for an unreachable host would hang
	// until its context ends; with one it fails fast and maps to 503.
	if pc.ConnConfig.ConnectTimeout == 0 || pc.ConnConfig.ConnectTimeout > cfg.AcquireTimeout {
		pc.ConnConfig.ConnectTimeout = cfg.AcquireTimeout
	}
	pc.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		encodeUUIDsAsBytes(c.TypeMap())
		return nil
	}
	p := &Pool{acquireTimeout: cfg.AcquireTimeout, commitTimeout: cfg.CommitTimeout}
	if p.commitTimeout == 0 {
		p.commitTimeout = 3 * time.Second
	}
	pc.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if strings.HasPrefix(n.Message, syncRepWarning) {
			p.syncRepCancelled.Store(c, true)
		}
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	if p.unknown, err = mp.Meter("github.com/payments-reference/idempotent-payments/internal/database").Int64Counter("db_commit_outcome_unknown",
		metric.WithDescription("COMMITs whose outcome the service could not learn, by reason: connection_lost (no answer came), sync_replication (committed on the primary, its wait for the synchronous standby cancelled). Each was answered 503 outcome-unknown.")); err != nil {
		return nil, fmt.Errorf("commit counter: %w", err)
	}
	if p.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	return p, nil
}

// Close closes every connection.
func (p *Pool) Close() { p.pool.Close() }

// Pgx returns the underlying pgx pool, for libraries that take one (River).
// Their waits are theirs to bound.
func (p *Pool) Pgx() *pgxpool.Pool { return p.pool }

// Stat returns the pool's statistics.
func (p *Pool) Stat() *pgxpool.Stat { return p.pool.Stat() }

// Ping checks that a connection can be had and the server answers.
func (p *Pool) Ping(ctx context.Context) error {
	return p.WithConn(ctx, func(c DBTX) error {
		_, err := c.Exec(ctx, ";")
		return Classify(err)
	})
}

// WithConn runs fn on a pooled connection outside any transaction, for a
// single statement that needs no tenant (authentication), and translates its
// error as InTenantTx does.
func (p *Pool) WithConn(ctx context.Context, fn func(DBTX) error) error {
	conn, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = fn(conn)
	p.heardSyncRepCancel(conn) // an autocommit statement's: cleared, as a batch's
	dropIfStandby(conn, err)
	return Classify(err)
}

// dropIfStandby closes conn when err says its server is a standby now
// (SQLSTATE 25006 after a failover demoted it), so that Release destroys it
// instead of pooling it: target_session_attrs=read-write is checked only
// when a connection is made, and every later request on this one would get
// 25006 too.
func dropIfStandby(conn *pgxpool.Conn, err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Conn().Close(ctx)
}

// Acquire takes a connection, waiting at most the pool's AcquireTimeout.
func (p *Pool) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, p.acquireTimeout)
	defer cancel()
	conn, err := p.pool.Acquire(actx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("acquire connection: %w", ctx.Err())
		}
		return nil, fmt.Errorf("acquire connection: %w: %w", ErrUnavailable, err)
	}
	return conn, nil
}

// TxOptions configure a tenant transaction.
type TxOptions struct {
	// LockTimeout bounds every lock wait in the transaction, including the
	// wait of a duplicate request on the unique index. Zero means no bound.
	LockTimeout time.Duration
	// ReadOnly begins the transaction READ ONLY. Such a transaction cannot
	// have had an effect, so a failure at COMMIT is ErrUnavailable, never
	// ErrOutcomeUnknown: a read is simply retried.
	ReadOnly bool
}

// InTenantTx runs fn in one READ COMMITTED transaction in which row-level
// security sees only principal's rows: for work whose tenant is already
// known, such as an outbox job's. It commits when fn returns nil and rolls
// back otherwise, also when fn panics or ctx is cancelled.
//
// BEGIN, the tenant and the lock timeout travel in one simple-protocol
// round trip: pgx sends a BeginQuery without arguments as one Query message,
// and PostgreSQL runs its statements in order. The tenant is a SET LOCAL
// made inside a function (setTenant), which a distributed PostgreSQL passes
// on to its nodes.
func InTenantTx(ctx context.Context, pool *Pool, principal uuid.UUID, opts TxOptions, fn func(pgx.Tx) error) error {
	return inTx(ctx, pool, "; "+setTenant(principal), opts, fn)
}

// setTenant is the statement that makes principal the transaction's tenant
// until it ends, for a simple-protocol BEGIN query (whose text pgx does not
// cache), so the value is in the text: a uuid.UUID's String form is hex and
// dashes only, which cannot inject anything. set_tenant (migration 15)
// runs a SET LOCAL rather than set_config(..., true) because Citus sends
// SET LOCAL on to the workers a transaction touches (with
// citus.propagate_set_commands = 'local'), where row-level security reads
// it; and inside a function, because Citus replays the text of the query
// that ran the SET, which for a SET sent beside BEGIN is the BEGIN too
// (docs/scaling.md).
func setTenant(principal uuid.UUID) string {
	return fmt.Sprintf("SELECT set_tenant('%s')", principal.String())
}

// InTx is InTenantTx for a request, whose tenant is not known yet: fn's
// first statement must set it, by authenticating the caller
// (auth.Credentials). Until then row-level security shows no rows at all.
func InTx(ctx context.Context, pool *Pool, opts TxOptions, fn func(pgx.Tx) error) error {
	return inTx(ctx, pool, "", opts, fn)
}

func inTx(ctx context.Context, pool *Pool, tenant string, opts TxOptions, fn func(pgx.Tx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()

	mode := "READ WRITE"
	if opts.ReadOnly {
		mode = "READ ONLY"
	}
	// The lock timeout through set_lock_timeout (migration 21), for the
	// reason setTenant gives: it must reach Citus's workers, where a claim
	// waits for a concurrent attempt's row lock.
	begin := fmt.Sprintf("BEGIN ISOLATION LEVEL READ COMMITTED %s%s; SELECT set_lock_timeout(%d)",
		mode, tenant, opts.LockTimeout.Milliseconds())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		dropIfStandby(conn, err)
		return fmt.Errorf("begin: %w", Classify(err))
	}
	defer func() {
		// A cancelled request context must not stop the rollback, or the
		// connection would go back to the pool inside an open transaction.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after a successful commit
	}()

	if err := fn(tx); err != nil {
		dropIfStandby(conn, err)
		// The one place a statement's error is translated (Classify): the
		// store code inside fn only says which statement failed.
		return Classify(err)
	}
	// The COMMIT runs to its answer whatever happens to the request: a
	// client that went away, or a request out of time, must not cancel it
	// halfway (context.WithoutCancel); its own timeout bounds it.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pool.commitTimeout)
	defer cancel()
	pool.heardSyncRepCancel(conn) // only this COMMIT's warning counts
	err = tx.Commit(cctx)
	if pool.heardSyncRepCancel(conn) && err == nil && !opts.ReadOnly {
		// Committed here, maybe not on the standby: a failover now would
		// lose it, and the client's retry would execute again. Not a
		// success to report.
		pool.unknown.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "sync_replication")))
		return fmt.Errorf("commit: %w: %s", ErrOutcomeUnknown, syncRepWarning)
	}
	if err != nil {
		dropIfStandby(conn, err)
		if opts.ReadOnly {
			return fmt.Errorf("commit: %w", Classify(err))
		}
		err = classifyCommit(err)
		if errors.Is(err, ErrOutcomeUnknown) {
			pool.unknown.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "connection_lost")))
		}
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// SendInTenant sends stmts between BEGIN with the statement that sets
// principal as the tenant, and COMMIT, in one round trip: the tenant holds
// for stmts and for nothing after them, and they commit together or not at
// all. (BEGIN is sent, rather than relying on the batch's implicit
// transaction, because Citus passes a SET LOCAL on to its workers only
// inside a transaction block. The tenant is set_tenant($1), migration 15: a
// SET LOCAL with the value in its text would be a statement of its own for
// every principal in pgx's statement cache.) It suits work whose statements
// do not depend on each other's results, such as an outbox job's read, or
// the answer it records with the job's completion. Whether a batch whose
// connection was lost had committed is unknown: only a caller that can
// repeat it safely (a job, which is retried) may use it for writes.
func SendInTenant(ctx context.Context, pool *Pool, principal uuid.UUID, stmts ...Statement) error {
	all := make([]Statement, 0, len(stmts)+3)
	all = append(all,
		Statement{SQL: "BEGIN ISOLATION LEVEL READ COMMITTED"},
		Statement{SQL: "SELECT set_tenant($1)", Args: []any{principal}})
	all = append(append(all, stmts...), Statement{SQL: "COMMIT"})
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// When a statement fails, the server skips the rest, COMMIT included,
	// and the failed transaction stays open: pgxpool closes a connection
	// released in a transaction, so none goes back to the pool in one.
	err = Send(ctx, conn, all...)
	// A batch is repeated by its job, which a processor key makes safe; a
	// warning heard here is only cleared, so that it is never taken for a
	// later COMMIT's on this connection.
	pool.heardSyncRepCancel(conn)
	dropIfStandby(conn, err)
	return Classify(err)
}

// heardSyncRepCancel reports whether conn heard, since the last call for it,
// that a COMMIT's wait for the synchronous standby was cancelled, and forgets
// it.
func (p *Pool) heardSyncRepCancel(conn *pgxpool.Conn) bool {
	_, heard := p.syncRepCancelled.LoadAndDelete(conn.Conn().PgConn())
	return heard
}

// classifyCommit tells a COMMIT that certainly did not happen from one whose
// outcome is unknown. An ERROR from the server (a deferred constraint, a
// serialization failure) or ROLLBACK for a transaction that had failed is
// definite: nothing was committed. So is a failure before the COMMIT message
// left this process. Anything else came after COMMIT was sent, and that
// includes a FATAL: a backend terminated while committing (an administrator,
// a failover) may have made the commit durable before it died.
func classifyCommit(err error) error {
	var pgErr *pgconn.PgError
	// A connection exception (class 08) or an internal error (class XX) at
	// COMMIT is Citus's coordinator telling that a worker's connection broke
	// while it committed ("could not commit transaction for shard ... on at
	// least one active node", XX000): the worker may have committed first.
	definite := errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) ||
		errors.As(err, &pgErr) && pgErr.Severity != "FATAL" && pgErr.Severity != "PANIC" &&
			!strings.HasPrefix(pgErr.Code, "08") && !strings.HasPrefix(pgErr.Code, "XX")
	if definite {
		return Classify(err)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// Classify wraps err with ErrUnavailable when it means the database cannot be
// reached or is refusing work for now, so callers can answer 503 instead of
// 500. Other errors are returned unchanged. InTenantTx and WithConn apply it
// to whatever their function returns, so store code does not; code that uses
// a connection of its own (the sweeper, migrations) calls it itself.
func Classify(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
			"53300",          // too_many_connections
			"55P03",          // lock_not_available: a row stayed locked past lock_timeout
			"40P01", "40001", // deadlock_detected, serialization_failure
			"25006": // read_only_sql_transaction: the server was a primary and is a standby now
			// All of these rolled the transaction back; the same request
			// can simply be retried.
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		// A FATAL ends the session, and with it any open transaction:
		// idle_in_transaction_session_timeout, a terminated backend. A
		// connection exception (class 08) before COMMIT is Citus's
		// coordinator losing a worker ("connection to the remote node ...
		// failed"): the worker's part of the transaction ended with its
		// connection.
		if pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" || strings.HasPrefix(pgErr.Code, "08") {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		// Citus's coordinator, finding its postmaster gone while it waited
		// on a worker, raises this internal error and exits: the node was
		// lost, and the transaction with it. Told apart from other XX000s
		// by its text, the only mark Citus gives it.
		if pgErr.Code == "XX000" && pgErr.Message == "postmaster was shut down, exiting" {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	// A lost connection before COMMIT: the server rolls the transaction
	// back when it notices, so the request had no effect. (After COMMIT was
	// sent, InTenantTx reports ErrOutcomeUnknown instead.)
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// IsLockTimeout reports whether err is PostgreSQL's lock_not_available, the
// error a statement gets when it waited longer than lock_timeout.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// DBTX is what store functions need to run SQL. It is satisfied by a pool, a
// connection and a pgx.Tx, so a caller decides which transaction a write joins.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// principalsPage is how many principals EachPrincipal reads at a time.
const principalsPage = 1000

// EachPrincipal calls fn with the id of every principal, in id order, a
// page at a time, on conn: for maintenance that works one principal at a
// time, so that each of its statements stays on one shard of a table
// distributed by principal (docs/scaling.md). The role needs SELECT (id)
// on principals, which migration 15 gives the maintenance role. An error
// from fn stops the walk and is returned.
func EachPrincipal(ctx context.Context, conn DBTX, fn func(uuid.UUID) error) error {
	var after uuid.UUID
	for {
		rows, err := conn.Query(ctx, `SELECT id FROM principals WHERE id > $1 ORDER BY id LIMIT $2`, after, principalsPage)
		if err != nil {
			return fmt.Errorf("list principals: %w", Classify(err))
		}
		page, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("list principals: %w", Classify(err))
		}
		for _, p := range page {
			if err := fn(p); err != nil {
				return err
			}
		}
		if len(page) < principalsPage {
			return nil
		}
		after = page[len(page)-1]
	}
}
