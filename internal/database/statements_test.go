package database

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/migrations"
)

// The distribution runs a statement at a time: each create_distributed_table
// on its own, the trigger function whole (its body has semicolons of its
// own), ALTER SYSTEM outside any transaction block.
func TestCitusDistributionSplitsIntoStatements(t *testing.T) {
	t.Parallel()
	stmts := statements(migrations.Citus)
	var distributed, triggers, functions int
	for _, s := range stmts {
		body := s
		for body = strings.TrimSpace(body); strings.HasPrefix(body, "--"); body = strings.TrimSpace(body) {
			_, body, _ = strings.Cut(body, "\n") // the comments above it
		}
		switch {
		case strings.HasPrefix(body, "SELECT create_distributed_table("):
			distributed++
		case strings.HasPrefix(body, "CREATE OR REPLACE TRIGGER"):
			triggers++
		case strings.HasPrefix(body, "CREATE OR REPLACE FUNCTION set_worker_xid()"):
			require.True(t, strings.HasSuffix(body, "$$;"), "the function is one statement:\n%s", body)
			require.Contains(t, body, "RETURN NEW;")
			functions++
		}
	}
	require.Equal(t, 1, functions)
	// Each statement of the file is one statement of the split, however
	// many tables a fork distributes (docs/fork.md takes some out).
	require.Equal(t, strings.Count(migrations.Citus, "\nSELECT create_distributed_table("), distributed)
	require.GreaterOrEqual(t, distributed, 5, "payments and the tables colocated with it")
	require.Equal(t, strings.Count(migrations.Citus, "\nCREATE OR REPLACE TRIGGER"), triggers)
	require.True(t, strings.HasPrefix(stmts[len(stmts)-2], "-- The tenant a request's SET LOCAL"))
	require.True(t, strings.HasSuffix(stmts[len(stmts)-2], "ALTER SYSTEM SET citus.propagate_set_commands = 'local';"))
	require.Equal(t, "SELECT pg_reload_conf();", stmts[len(stmts)-1])
}

// A statement ends at a semicolon before a trailing comment too, and a
// semicolon in a comment or a $$ body ends nothing: a migration runs a
// statement at a time (statementDriver), so one left joined to the next
// would reach Citus as the multi-statement string it refuses.
func TestStatementsEndBeforeATrailingComment(t *testing.T) {
	t.Parallel()
	got := statements(`BEGIN;
-- a comment; with a semicolon
GRANT CREATE ON SCHEMA public TO payments_definer; -- for the handover
CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$
    SELECT 1; -- inside the body
$$;
SELECT '--not a comment;';
COMMIT;
`)
	require.Equal(t, []string{
		"BEGIN;",
		"-- a comment; with a semicolon\nGRANT CREATE ON SCHEMA public TO payments_definer; -- for the handover",
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$\n    SELECT 1; -- inside the body\n$$;",
		"SELECT '--not a comment;';",
		"COMMIT;",
	}, got)
	// Every migration splits into statements that each end with one.
	entries, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, name := range entries {
		raw, err := fs.ReadFile(migrations.FS, name)
		require.NoError(t, err)
		for _, stmt := range statements(string(raw)) {
			last := stmt[strings.LastIndex(stmt, "\n")+1:]
			if i := strings.Index(last, "--"); i >= 0 && strings.Count(last[:i], "'")%2 == 0 {
				last = last[:i]
			}
			require.True(t, strings.HasSuffix(strings.TrimSpace(last), ";"), "%s: a statement that does not end with one:\n%s", name, stmt)
		}
	}
}
