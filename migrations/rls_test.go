package migrations_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var tenantTables = []string{"payments", "refunds", "idempotency_keys"}

// seed creates, as the superuser, one payment, refund and key for each of
// two principals.
func seed(t *testing.T, db testdb.DB) (a, b uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	a, b = uuid.New(), uuid.New()
	for _, p := range []uuid.UUID{a, b} {
		pay := uuid.New()
		_, err := admin.Exec(ctx, `
			INSERT INTO payments (id, principal_id, amount, currency, status, created_at, processor_key) VALUES ($1, $2, 1000, 'usd', 'succeeded', now(), gen_random_uuid()::text);
			`, pay, p)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `INSERT INTO refunds (id, principal_id, payment_id, amount, currency, status, created_at, processor_key, charge_key, charge_id) VALUES ($1, $2, $3, 100, 'usd', 'succeeded', now(), gen_random_uuid()::text, gen_random_uuid()::text, '')`, uuid.New(), p, pay)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, response_status, response_body, correlation_id, expires_at)
			VALUES ($1, 'POST /v1/payments', 'shared', 'completed', sha256(''), 201, 'secret response', 'req', now() + interval '1 day')`, p)
		require.NoError(t, err)
	}
	return a, b
}

// asApp runs fn in a transaction of the service role, with principal set
// the way the service sets it (or not at all when principal is nil).
func asApp(t *testing.T, db testdb.DB, principal *uuid.UUID, fn func(tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.AppURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the test never commits
	if principal != nil {
		_, err = tx.Exec(ctx, `SELECT set_config('app.principal_id', $1, true)`, principal.String())
		require.NoError(t, err)
	}
	fn(tx)
}

func count(t *testing.T, tx pgx.Tx, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, tx.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// requireRefused asserts a statement fails with insufficient_privilege
// (42501), which is what a row-level security WITH CHECK violation raises.
func requireRefused(t *testing.T, tx pgx.Tx, sql string, args ...any) {
	t.Helper()
	requireSQLState(t, tx, "42501", sql, args...)
}

// requireSQLState asserts a statement fails with the SQLSTATE code, inside a
// savepoint so that the transaction goes on.
func requireSQLState(t *testing.T, tx pgx.Tx, code, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	_, err := tx.Exec(ctx, "SAVEPOINT s")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sql, args...)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want an error, got %v", sql, err)
	require.Equal(t, code, pgErr.Code, "%s: %s", sql, pgErr.Message)
	_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s")
	require.NoError(t, err)
}

func TestServiceRolesAreSubjectToRowLevelSecurity(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 2)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.AppURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, role := range []string{"payments_app", "payments_maintenance"} {
		var super, bypass bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1`, role).Scan(&super, &bypass))
		require.False(t, super, role)
		require.False(t, bypass, role)
	}
	for _, table := range tenantTables {
		var owner string
		var enabled, forced bool
		require.NoError(t, conn.QueryRow(ctx, `
			SELECT pg_get_userbyid(relowner), relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = $1::regclass`, table).
			Scan(&owner, &enabled, &forced))
		require.NotEqual(t, "payments_app", owner, table)
		require.True(t, enabled, table)
		require.True(t, forced, table)
	}
}

func TestNoPrincipalSeesNothing(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 2)
	a, _ := seed(t, db)
	asApp(t, db, nil, func(tx pgx.Tx) {
		for _, table := range tenantTables {
			require.Zero(t, count(t, tx, `SELECT count(*) FROM `+table), table)
		}
	})
	// After a transaction that set the principal ends, the setting reads back
	// as '' rather than NULL: the policy must still match nothing, not fail.
	asApp(t, db, &a, func(tx pgx.Tx) {
		_, err := tx.Exec(context.Background(), `SELECT set_config('app.principal_id', '', true)`)
		require.NoError(t, err)
		for _, table := range tenantTables {
			require.Zero(t, count(t, tx, `SELECT count(*) FROM `+table), table)
		}
	})
}

func TestOnePrincipalCannotTouchAnothersRows(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 2)
	a, b := seed(t, db)
	asApp(t, db, &a, func(tx pgx.Tx) {
		ctx := context.Background()
		for _, table := range tenantTables {
			require.Equal(t, 1, count(t, tx, `SELECT count(*) FROM `+table), "own rows of "+table)
			require.Zero(t, count(t, tx, `SELECT count(*) FROM `+table+` WHERE principal_id = $1`, b), table)
		}

		tag, err := tx.Exec(ctx, `UPDATE payments SET amount_refunded = 1000 WHERE principal_id = $1`, b)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected())
		tag, err = tx.Exec(ctx, `UPDATE idempotency_keys SET response_body = 'forged' WHERE principal_id = $1`, b)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected())

		// Writing rows in another principal's name is refused outright.
		requireRefused(t, tx, `INSERT INTO payments (id, principal_id, amount, currency, status, created_at, processor_key) VALUES ($1, $2, 1, 'usd', 'succeeded', now(), gen_random_uuid()::text)`, uuid.New(), b)
		requireRefused(t, tx, `UPDATE payments SET principal_id = $1`, b)
		requireRefused(t, tx, `INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, correlation_id, expires_at)
			VALUES ($1, 'POST /v1/payments', 'new', 'in_progress', sha256(''), 'req', now() + interval '1 day')
			ON CONFLICT (principal_id, endpoint, key) DO NOTHING`, b)
		// The service role cannot delete at all; expiry is the sweeper's job.
		requireRefused(t, tx, `DELETE FROM idempotency_keys`)
		requireRefused(t, tx, `DELETE FROM payments`)
	})
}

func TestMaintenanceRoleSeesNoResponsesAndDeletesOnlyExpiredRows(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 2)
	seed(t, db)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '3 days', expires_at = now() - interval '1 second'
		WHERE principal_id = (SELECT principal_id FROM idempotency_keys LIMIT 1)`)
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, db.MaintenanceURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the test never commits

	require.Equal(t, 2, count(t, tx, `SELECT count(*) FROM idempotency_keys`))
	requireRefused(t, tx, `SELECT response_body FROM idempotency_keys`)
	requireRefused(t, tx, `SELECT fingerprint FROM idempotency_keys`)
	requireRefused(t, tx, `SELECT count(*) FROM payments`)
	tag, err := tx.Exec(ctx, `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "only the expired row")
}

// The service role authenticates through authenticate_request, which sets
// the tenant from the key, and cannot read keys or principals; it updates only the columns the service changes; it
// adds quota claims only through add_idempotency_key_claims.
func TestServiceRoleHasLeastPrivilege(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 2)
	a, b := seed(t, db)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	live, revoked := uuid.New(), uuid.New()
	_, err = admin.Exec(ctx, `INSERT INTO principals (id, name) VALUES ($1, 'acme')`, a)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `INSERT INTO api_keys (id, principal_id, secret_hash, scopes, revoked_at)
		VALUES ($2, $1, sha256('live'), '{payments:read}', NULL), ($3, $1, sha256('revoked'), '{payments:read}', now())`,
		a, live, revoked)
	require.NoError(t, err)

	asApp(t, db, &a, func(tx pgx.Tx) {
		requireRefused(t, tx, `SELECT count(*) FROM api_keys`)
		requireRefused(t, tx, `SELECT count(*) FROM principals`)

		requireSQLState(t, tx, "PA401", `SELECT * FROM authenticate_request(sha256('revoked'), 'payments:read')`)
		requireSQLState(t, tx, "PA403", `SELECT * FROM authenticate_request(sha256('live'), 'payments:write')`)
		// A temporary table of the caller's cannot stand in for api_keys
		// inside the SECURITY DEFINER function.
		_, err := tx.Exec(ctx, `
			CREATE TEMP TABLE api_keys (id uuid, principal_id uuid, secret_hash bytea, scopes text[], revoked_at timestamptz);
			INSERT INTO pg_temp.api_keys VALUES (gen_random_uuid(), gen_random_uuid(), sha256('forged'), '{payments:write}', NULL);`)
		require.NoError(t, err)
		requireSQLState(t, tx, "PA401", `SELECT * FROM authenticate_request(sha256('forged'), 'payments:write')`)

		// A live key with the scope: its principal becomes the tenant.
		_, err = tx.Exec(ctx, `SELECT set_config('app.principal_id', $1, true)`, b.String())
		require.NoError(t, err)
		var id, principal uuid.UUID
		require.NoError(t, tx.QueryRow(ctx, `SELECT key_id, principal_id FROM authenticate_request(sha256('live'), 'payments:read')`).Scan(&id, &principal))
		require.Equal(t, []uuid.UUID{live, a}, []uuid.UUID{id, principal})
		var tenant string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('app.principal_id')`).Scan(&tenant))
		require.Equal(t, a.String(), tenant, "the tenant is the key's principal, whatever was set before")

		// What the service changes: the refunded amount, and the outcome the
		// outbox worker records.
		_, err = tx.Exec(ctx, `UPDATE payments SET amount_refunded = amount_refunded, status = status, failure_reason = failure_reason, processor_id = processor_id, settle_event_id = settle_event_id`)
		require.NoError(t, err)
		for _, column := range []string{"amount", "currency", "description", "metadata", "created_at", "id"} {
			requireRefused(t, tx, `UPDATE payments SET `+column+` = `+column)
		}
		for _, column := range []string{"principal_id", "endpoint", "key"} {
			requireRefused(t, tx, `UPDATE idempotency_keys SET `+column+` = `+column)
		}

		hour := `date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`
		requireRefused(t, tx, `INSERT INTO idempotency_key_usage VALUES ($1, `+hour+`, 1)`, b)
		requireRefused(t, tx, `UPDATE idempotency_key_usage SET claims = 0`)
		requireRefused(t, tx, `DELETE FROM idempotency_key_usage`)
		_, err = tx.Exec(ctx, `SELECT add_idempotency_key_claims(ARRAY[$1::uuid], ARRAY[`+hour+`], ARRAY[2::bigint])`, a)
		require.NoError(t, err)
		require.Equal(t, 2, count(t, tx, `SELECT claims FROM idempotency_key_usage WHERE principal_id = $1`, a))
		// invalid_parameter_value: a count that is not positive, a bucket
		// in the future, a bucket not on the hour.
		for _, args := range []string{
			`ARRAY[` + hour + `], ARRAY[-5::bigint]`,
			`ARRAY[` + hour + ` + interval '1 day'], ARRAY[1::bigint]`,
			`ARRAY[` + hour + ` - interval '1 minute'], ARRAY[1::bigint]`,
		} {
			requireSQLState(t, tx, "22023", `SELECT add_idempotency_key_claims(ARRAY[$1::uuid], `+args+`)`, a)
		}
	})
}

// Every SECURITY DEFINER function belongs to payments_definer, which cannot
// log in, is no superuser and bypasses no policy: a flaw in a function runs
// with its few rights, never the superuser's.
func TestDefinerFunctionsAreOwnedByARoleOfTheirOwn(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 1)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT p.proname, pg_get_userbyid(p.proowner) FROM pg_proc p
		WHERE p.prosecdef AND p.pronamespace = 'public'::regnamespace ORDER BY 1`)
	require.NoError(t, err)
	owners := map[string]string{}
	for rows.Next() {
		var name, owner string
		require.NoError(t, rows.Scan(&name, &owner))
		owners[name] = owner
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{
		"add_idempotency_key_claims": "payments_definer",
		"authenticate_request":       "payments_definer",
		"outbox_pending":             "payments_definer",
		"outbox_relayed":             "payments_definer",
		"reconciliation_backlog":     "payments_definer",
		"reconciliation_candidates":  "payments_definer",
	}, owners)
	var login, super, bypass, create bool
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT rolcanlogin, rolsuper, rolbypassrls, has_schema_privilege('payments_definer', 'public', 'CREATE')
		FROM pg_roles WHERE rolname = 'payments_definer'`).Scan(&login, &super, &bypass, &create))
	require.False(t, login)
	require.False(t, super)
	require.False(t, bypass)
	require.False(t, create, "CREATE on the schema is granted only for the handover")
	// It reads undecided rows' ids across tenants, never a payment's amount
	// or metadata, and writes no tenant table.
	var canAmount, canWrite bool
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT has_column_privilege('payments_definer', 'payments', 'amount', 'SELECT'),
		       has_table_privilege('payments_definer', 'payments', 'INSERT, UPDATE, DELETE')
		    OR has_table_privilege('payments_definer', 'refunds', 'INSERT, UPDATE, DELETE')
		    OR has_table_privilege('payments_definer', 'idempotency_keys', 'SELECT, INSERT, UPDATE, DELETE')`).Scan(&canAmount, &canWrite))
	require.False(t, canAmount)
	require.False(t, canWrite)
}

// What the service role may do to the outbox, exactly as README.md ("Database
// roles") states it: River's client needs all four on river_job (its cleaner
// deletes finished jobs, its rescuer and completer update them). So a
// compromised service can delete or complete a pending charge job; the
// reconciler then finds the payment undecided without a live job and settles
// it from the processor's ledger (internal/httpapi's
// TestAPaymentWhoseJobWasDeletedIsReconciled), so no payment is stranded.
func TestServiceRolesPrivilegesOnTheOutbox(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 1)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT table_name || ' ' || string_agg(privilege_type, ',' ORDER BY privilege_type)
		FROM information_schema.role_table_grants
		WHERE grantee = 'payments_app' AND table_name LIKE 'river%'
		GROUP BY table_name ORDER BY table_name`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{
		"river_job DELETE,INSERT,SELECT,UPDATE",
		"river_leader DELETE,INSERT,SELECT,UPDATE",
		"river_migration SELECT",
		"river_notification DELETE,INSERT,SELECT,UPDATE",
		"river_queue DELETE,INSERT,SELECT,UPDATE",
	}, got)
}
