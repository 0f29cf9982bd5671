BEGIN;
ALTER TABLE idempotency_keys DROP COLUMN trace_parent;
COMMIT;
