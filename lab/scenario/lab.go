// Package scenario runs the failure lab: each naive way of storing idempotency
// keys that the lesson warns about, next to this service's design, against
// real PostgreSQL and Redis, counting what each did. Every scenario returns
// whether the naive build broke and whether ours held; the tests assert both,
// so every claim the lab makes is tested (docs/lab.md).
package scenario

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// Env is what the scenarios run against: a migrated database the lab may
// fill, as a superuser (the expiry scenarios bypass row-level security to
// fill tables), and a Redis server.
type Env struct {
	AdminURL  string
	RedisAddr string
	// Rows sizes the expiry scenarios' tables; Concurrency the duplicate
	// scenarios' retries.
	Rows        int
	Concurrency int
}

// Outcome is one scenario's two results, in words and as verdicts.
type Outcome struct {
	Naive, Ours          string
	NaiveBroke, OursHeld bool
	// Structural, when set, says what the verdict rests on when it is a
	// property of the design (how many rows one transaction locks) rather
	// than a measurement that shows it at every size: the lab prints it, so
	// that a row whose timings favour the naive build at a small size does
	// not seem to contradict its verdict.
	Structural string
	// Shown is what the row measured, in figures, for the lesson column:
	// "naive: 20 payments; ours: 1". A verdict alone ("holds") would not
	// say whether the hazard or the service held.
	Shown string
}

// num formats a count with thousands separators, as every figure the lab
// prints is: 100,000, not 100000.
func num[T ~int | ~int64](v T) string {
	s := strconv.FormatInt(int64(v), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// Scenario is one naive design against ours.
type Scenario struct {
	Name string
	Run  func(ctx context.Context, l *Lab) (Outcome, error)
}

// Lab holds the connections every scenario shares.
type Lab struct {
	env    Env
	admin  *pgxpool.Pool // the owner: naive tables, assertions
	app    *database.Pool
	maint  *database.Pool
	redis  *redis.Client
	jobs   outbox.Writer
	prefix string // keys of this run, so runs never collide
}

// Open connects to env's database and Redis. Close it when done.
func Open(ctx context.Context, env Env) (*Lab, error) {
	l := &Lab{env: env, prefix: uuid.NewString()[:8]}
	var err error
	pc, err := pgxpool.ParseConfig(env.AdminURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	pc.MaxConns = AdminConns
	if l.admin, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	cfg := database.PoolConfig{MaxConns: AppConns, AcquireTimeout: 30 * time.Second}
	if l.app, err = database.Open(ctx, database.WithUser(env.AdminURL, "payments_app"), cfg); err != nil {
		l.Close()
		return nil, err
	}
	if l.maint, err = database.Open(ctx, database.WithUser(env.AdminURL, "payments_maintenance"), database.PoolConfig{MaxConns: MaintConns, AcquireTimeout: 30 * time.Second}); err != nil {
		l.Close()
		return nil, err
	}
	l.jobs = outbox.Writer{MaxAttempts: 1}
	l.redis = redis.NewClient(&redis.Options{Addr: env.RedisAddr})
	if _, err := l.admin.Exec(ctx, naiveSchema); err != nil {
		l.Close()
		return nil, fmt.Errorf("naive tables: %w", err)
	}
	return l, nil
}

// Connections a Lab holds at most: the service role's pool, the maintenance
// role's, and the superuser's.
const (
	AppConns   = 6
	MaintConns = 2
	AdminConns = 4
)

// Close releases the connections.
func (l *Lab) Close() {
	if l.redis != nil {
		l.redis.Close()
	}
	if l.maint != nil {
		l.maint.Close()
	}
	if l.app != nil {
		l.app.Close()
	}
	if l.admin != nil {
		l.admin.Close()
	}
}

// naiveSchema is what the naive builds store: a key table with no
// principal, no state and no fingerprint, and the payments they make.
const naiveSchema = `
CREATE TABLE IF NOT EXISTS lab_naive_keys (
    key        text PRIMARY KEY,
    response   text NOT NULL,
    expires_at timestamptz NOT NULL DEFAULT 'infinity'
);
CREATE TABLE IF NOT EXISTS lab_naive_payments (
    id        uuid PRIMARY KEY,
    principal text NOT NULL,
    intent    text NOT NULL
);`

// key makes a key unique to this run.
func (l *Lab) key(s string) string { return l.prefix + "-" + s }

// executor is this service's idempotency executor with the given retention
// and response cap.
func (l *Lab) executor(retention time.Duration, maxStored int) (*idempotency.Executor, error) {
	return idempotency.NewExecutor(l.app, idempotency.Config{Retention: retention, LockTimeout: 10 * time.Second, MaxStoredResponseBytes: maxStored})
}

// caller is a principal with an API key, as the service authenticates it.
type caller struct {
	id    uuid.UUID
	creds auth.Credentials
}

// newCaller creates a principal of its own with a key that may pay.
func (l *Lab) newCaller(ctx context.Context) (caller, error) {
	var key auth.NewKey
	err := pgx.BeginFunc(ctx, l.admin, func(tx pgx.Tx) (err error) {
		key, err = auth.CreateKey(ctx, tx, l.key("caller-"+uuid.NewString()), []string{auth.ScopePaymentsWrite})
		return err
	})
	if err != nil {
		return caller{}, fmt.Errorf("create a principal: %w", err)
	}
	creds, err := auth.ParseCredentials("Bearer " + key.Secret)
	return caller{id: key.PrincipalID, creds: creds}, err
}

// authenticate is idempotency.Request.Authenticate for c.
func (c caller) authenticate() (database.Statement, *uuid.UUID) {
	var p auth.Principal
	return c.creds.Authentication(auth.ScopePaymentsWrite, &p), &p.ID
}

// pay is this service's payment under a key: the real executor and the real
// payment write, with the payment's intent in its metadata for counting.
func (l *Lab) pay(ctx context.Context, e *idempotency.Executor, principal caller, key string, amount int64) (idempotency.Result, error) {
	body := fmt.Sprintf(`{"amount":%d,"currency":"usd"}`, amount)
	req := idempotency.Request{
		Authenticate: principal.authenticate,
		Scope:        idempotency.Scope{Endpoint: "POST /v1/payments", Key: key},
		Fingerprint:  idempotency.Fingerprint("POST", "/v1/payments", []byte(body)),
		RequestID:    "req_" + uuid.NewString(),
	}
	in := payments.NewPayment{Amount: &amount, Currency: "usd", Metadata: map[string]string{"intent": key}}
	return e.Do(ctx, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			p, writes, err := payments.Create(ctx, l.jobs, payments.CreateParams{Principal: w.Principal, New: in, Now: w.Now, ProcessorKey: w.Intent})
			if err != nil {
				return idempotency.Outcome{}, err
			}
			return idempotency.Outcome{Response: idempotency.Response{Status: 201, ContentType: "application/json", Body: []byte(p.ID.String())}, Writes: writes}, nil
		},
	})
}

// ourPayments counts this service's payments made for an intent.
func (l *Lab) ourPayments(ctx context.Context, intent string) (int, error) {
	var n int
	err := l.admin.QueryRow(ctx, `SELECT count(*) FROM payments WHERE metadata->>'intent' = $1`, intent).Scan(&n)
	return n, err
}

// naivePayments counts the naive builds' payments for an intent.
func (l *Lab) naivePayments(ctx context.Context, intent string) (int, error) {
	var n int
	err := l.admin.QueryRow(ctx, `SELECT count(*) FROM lab_naive_payments WHERE intent = $1`, intent).Scan(&n)
	return n, err
}

// naivePay records a naive payment and returns its id as the response.
func (l *Lab) naivePay(ctx context.Context, principal, intent string) (string, error) {
	id := uuid.NewString()
	_, err := l.admin.Exec(ctx, `INSERT INTO lab_naive_payments (id, principal, intent) VALUES ($1, $2, $3)`, id, principal, intent)
	return id, err
}
