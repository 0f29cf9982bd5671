package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// Relay copies the jobs that requests wrote into outbox_jobs, on their
// payment's shard, into River's river_job, where the workers take them;
// then it deletes them from outbox_jobs. Two transactions, in that order:
// on Citus outbox_jobs is on the workers and river_job on the coordinator,
// and a transaction across the two is not atomic (one node commits before
// the other). A relay that dies between them copies the same rows again
// next time, and River's unique index on the key made from each row's id
// (relayKey) keeps the second copy out: every job is enqueued exactly once.
//
// Every api serve process runs a relay, workers or not; a transaction-scoped
// advisory lock lets one copy at a time, so they do not race for the same
// rows.
type Relay struct {
	// Pool is the service role's; the cross-tenant read and delete are the
	// definer's functions outbox_pending and outbox_relayed.
	Pool *database.Pool
	// Batch is how many jobs one pass copies at most.
	Batch int
	// Interval is the wait after a pass that found fewer than Batch jobs.
	// It is most of what the relay adds to a charge's lag.
	Interval time.Duration
	// OnError hears a pass that failed; the relay tries again after twice
	// the last wait, up to 5 s.
	OnError func(error)
}

// relayLock is the advisory lock key of a relay pass ('outbox' in ASCII).
const relayLock = 0x6f7574626f78

// maxRelayBackoff bounds the wait after failed passes: a database that is
// down is asked again every few seconds, not every Interval, and the log
// gets a line per try, not twenty a second.
const maxRelayBackoff = 5 * time.Second

// Run relays until ctx ends.
func (r Relay) Run(ctx context.Context) {
	wait := r.Interval
	for {
		n, err := r.Once(ctx)
		if err != nil && ctx.Err() == nil && r.OnError != nil {
			r.OnError(err)
		}
		switch {
		case err != nil && n == 0:
			wait = min(2*wait, maxRelayBackoff)
		case err == nil && n >= r.Batch:
			continue // more may wait
		default: // copied, even if its delete failed: no reason to slow down
			wait = r.Interval
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// relayKey is the River unique key of the copy of an outbox row o: the
// row's id, prefixed so that it cannot be a key River computes itself (a
// sha256, 32 bytes).
const relayKey = `convert_to('outbox:', 'UTF8') || uuid_send(o.id)`

// relaySQL copies the oldest pending jobs into River and returns the ids
// of all it read, the ones copied by an earlier pass that died before its
// delete included (its unique key keeps them out). unique_states is every
// state, so the key holds for as long as River keeps the job.
const relaySQL = `
	WITH pending AS (SELECT * FROM outbox_pending($1)),
	copied AS (
		INSERT INTO river_job (args, kind, max_attempts, metadata, queue, state, created_at, unique_key, unique_states)
		SELECT o.args, o.kind, o.max_attempts, o.metadata, o.queue, 'available', o.created_at, ` + relayKey + `, B'11111111'
		FROM pending o
		ON CONFLICT (unique_key)
		    WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL
		      AND river_job_state_in_bitmask(unique_states, state)
		    DO NOTHING)
	SELECT principal_id, id FROM pending`

// Once runs one pass: it copies up to Batch jobs into River, deletes them
// from outbox_jobs, and returns how many it read, with the delete's error
// if only that failed (the jobs are in River then). It reads none while
// another relay's pass holds the lock.
func (r Relay) Once(ctx context.Context) (int, error) {
	var principals, ids []uuid.UUID
	err := database.InTx(ctx, r.Pool, database.TxOptions{}, func(tx pgx.Tx) error {
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, relayLock).Scan(&mine); err != nil || !mine {
			return err
		}
		rows, err := tx.Query(ctx, relaySQL, r.Batch)
		if err != nil {
			return err
		}
		var principal, id uuid.UUID
		_, err = pgx.ForEachRow(rows, []any{&principal, &id}, func() error {
			principals, ids = append(principals, principal), append(ids, id)
			return nil
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("relay outbox jobs into River: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	// A row the delete cannot lock within a second (a transaction holds it:
	// on Citus, a two-phase commit a dead worker left prepared holds its
	// rows until the coordinator's recovery, up to a minute) fails this
	// delete only. The rows stay, the next pass copies them again (the
	// unique key keeps them out of River) and copies the newer ones too, so
	// the charges behind them go on.
	err = database.InTx(ctx, r.Pool, database.TxOptions{LockTimeout: time.Second}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT outbox_relayed($1, $2)`, principals, ids)
		return err
	})
	if err != nil {
		return len(ids), fmt.Errorf("delete relayed outbox jobs: %w", err)
	}
	return len(ids), nil
}
