BEGIN;

-- A response larger than the configured cap is not stored; a reference to the
-- resource is, and a replay re-derives the response from it.
ALTER TABLE idempotency_keys
    ADD COLUMN response_ref text,
    ADD CONSTRAINT idempotency_keys_body_or_ref
        CHECK (response_body IS NULL OR response_ref IS NULL);

-- Claims per principal per hour, for the key quota. Each service instance
-- counts its claims in memory and adds them here in one statement about once
-- a second, so no request ever writes, or waits on, a counter row. Live keys
-- of a principal ~ the sum of its buckets inside the retention period. It
-- holds only counts, and one flush writes many principals' counts at once, so
-- it is not under row-level security.
CREATE TABLE idempotency_key_usage (
    principal_id uuid        NOT NULL,
    bucket       timestamptz NOT NULL,
    claims       bigint      NOT NULL CHECK (claims >= 0),
    PRIMARY KEY (principal_id, bucket)
);
GRANT SELECT, INSERT, UPDATE ON idempotency_key_usage TO payments_app;
GRANT SELECT, DELETE ON idempotency_key_usage TO payments_maintenance;

-- The sweeper locks the rows it is about to delete (FOR UPDATE SKIP LOCKED),
-- so that a late retry taking over an expired row and the sweeper never work
-- on the same row at once. Locking needs the UPDATE privilege and an UPDATE
-- policy; WITH CHECK (false) makes sure the lock is all it can do.
GRANT UPDATE (expires_at) ON idempotency_keys TO payments_maintenance;
CREATE POLICY idempotency_keys_maintenance_lock ON idempotency_keys
    FOR UPDATE TO payments_maintenance
    USING (expires_at < now())
    WITH CHECK (false);

COMMIT;
