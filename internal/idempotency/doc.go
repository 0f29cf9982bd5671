// Package idempotency stores idempotency keys in PostgreSQL and runs the
// protocol that makes a retried request safe: claim the key, execute, store
// the response, all in the caller's one transaction; or replay what an
// earlier attempt stored.
//
// The record is (principal, endpoint, key) -> state, fingerprint, response.
// The primary key on that scope is the only concurrency control: a claim is a
// single INSERT ... ON CONFLICT, never a SELECT first, so two concurrent
// attempts cannot both execute. See docs/idempotency.md for the whole design.
//
// The package knows nothing of payments or HTTP: an endpoint hands it an
// Operation, and it hands back the bytes to send.
package idempotency
