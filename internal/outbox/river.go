package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// This file and the SQL of this package are the only Go that reads or writes
// River's table, river_job, by hand instead of through River's API: the
// relay's copy of outbox_jobs (Relay), a job completed with its answer
// (Complete), the reconciler's question about a row's job (Live), and
// the gauges. Migrations 10 and 16 (the reconciler's candidates before
// migration 23, the queues), migration 24's down (which hands waiting jobs
// to River) and river_grants.sql name it too.

// RiverSchema is the version of River's schema (rivermigrate's) that this
// SQL was written against. TestRiverSchema fails when the river module
// brings another version, or river_job lacks a column used here with its
// type (riverColumns): read River's migration notes for the columns below,
// mend the SQL, then raise this.
const RiverSchema = 8

// riverColumns are river_job's columns that this package's SQL and the
// migrations' use, with their types (format_type).
var riverColumns = map[string]string{
	"id":            "bigint",
	"args":          "jsonb",
	"kind":          "text",
	"max_attempts":  "smallint",
	"metadata":      "jsonb",
	"queue":         "text",
	"state":         "river_job_state",
	"created_at":    "timestamp with time zone",
	"scheduled_at":  "timestamp with time zone",
	"finalized_at":  "timestamp with time zone",
	"unique_key":    "bytea",
	"unique_states": "bit(8)",
}

// OldestUnfinished returns how long ago the oldest job of kind that has not
// finished (waiting, running, or between attempts) was inserted, in
// seconds; 0 when there is none.
func OldestUnfinished(ctx context.Context, db database.DBTX, kind string) (float64, error) {
	var age float64
	err := db.QueryRow(ctx, `
		SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM river_job
		WHERE kind = $1 AND state IN ('available', 'running', 'retryable', 'scheduled')`, kind).Scan(&age)
	return age, err
}

// Live reports whether a job of kind whose args carry field = id is
// waiting, running, or finished less than grace ago: the reconciler leaves
// such a row to its job, whose call may still reach the processor. The
// match is River's GIN index on args.
func Live(ctx context.Context, db database.DBTX, kind, field string, id any, grace time.Duration) (bool, error) {
	var live bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (
			SELECT FROM river_job
			WHERE kind = $1 AND args @> jsonb_build_object($2::text, $3::text)
			  AND (finalized_at IS NULL OR finalized_at > now() - $4::interval))`,
		kind, field, fmt.Sprint(id), grace).Scan(&live)
	if err != nil {
		return false, fmt.Errorf("look for a live %s job: %w", kind, err)
	}
	return live, nil
}
