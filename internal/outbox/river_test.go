package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The SQL this package writes against river_job holds only for the River
// schema it was written for: an upgrade of the river module that brings a
// new schema version, or changes a column this SQL uses, fails here before
// it can fail in production.
func TestRiverSchema(t *testing.T) {
	t.Parallel()
	require.Equal(t, RiverSchema, database.RiverVersion(),
		"the river module brings schema version %d; this package's SQL knows %d: check river_job's changes, mend the SQL, raise RiverSchema", database.RiverVersion(), RiverSchema)

	db := testdb.New(t, 1)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.AdminURL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	rows, err := conn.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a WHERE a.attrelid = 'river_job'::regclass AND a.attnum > 0 AND NOT a.attisdropped`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		var c [2]string
		return c, row.Scan(&c[0], &c[1])
	})
	require.NoError(t, err)
	have := map[string]string{}
	for _, c := range got {
		have[c[0]] = c[1]
	}
	for name, typ := range riverColumns {
		require.Equal(t, typ, have[name], "river_job.%s", name)
	}
}
