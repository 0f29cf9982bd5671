package database

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Citus reports a worker it cannot reach as an ERROR of class 08 on the
// coordinator. Before COMMIT the worker's part of the transaction ended with
// its connection: 503, no effect, retry. At COMMIT the worker may have
// committed before its connection broke: the outcome is unknown. Found by
// killing a worker under load (the nodes-lost test, now faults' TestFaultsOnCitus):
// every request that met the dead worker answered 500.
func TestARemoteNodeLostIsUnavailableOrUnknown(t *testing.T) {
	t.Parallel()
	err := &pgconn.PgError{Severity: "ERROR", Code: "08006",
		Message: "connection to the remote node payments_app@127.0.0.1:26369 failed with the following error: Connection refused"}
	require.ErrorIs(t, Classify(err), ErrUnavailable)
	require.ErrorIs(t, classifyCommit(err), ErrOutcomeUnknown)
	require.NotErrorIs(t, classifyCommit(err), ErrUnavailable)

	// The worker lost during its COMMIT: it answered 500 "no effect".
	err = &pgconn.PgError{Severity: "ERROR", Code: "XX000",
		Message: "could not commit transaction for shard 102022 on at least one active node"}
	require.ErrorIs(t, classifyCommit(err), ErrOutcomeUnknown)

	// The coordinator lost (kill -9 of its every process) while a request
	// waited on a worker: its backend raised this and exited. Found by the
	// fault suite on Citus (go run ./faults -citus): 2 of 1,700 attempts
	// answered 500 in the coordinator's phase.
	err = &pgconn.PgError{Severity: "ERROR", Code: "XX000", Message: "postmaster was shut down, exiting"}
	require.ErrorIs(t, Classify(err), ErrUnavailable)
	require.ErrorIs(t, classifyCommit(err), ErrOutcomeUnknown)
	// Any other internal error before COMMIT is a fault of the service's
	// or the database's, not a node lost: 500.
	err = &pgconn.PgError{Severity: "ERROR", Code: "XX000", Message: "cache lookup failed for type 0"}
	require.NotErrorIs(t, Classify(err), ErrUnavailable)

	// A COMMIT that PostgreSQL refused is a definite rollback.
	err = &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}
	require.NotErrorIs(t, classifyCommit(err), ErrOutcomeUnknown)
}
