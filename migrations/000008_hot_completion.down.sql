BEGIN;
ALTER TABLE idempotency_keys RESET (fillfactor);
CREATE INDEX idempotency_keys_in_progress_idx ON idempotency_keys (created_at)
    WHERE state = 'in_progress';
COMMIT;
