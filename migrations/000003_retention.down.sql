BEGIN;
DROP POLICY idempotency_keys_maintenance_lock ON idempotency_keys;
REVOKE UPDATE (expires_at) ON idempotency_keys FROM payments_maintenance;
DROP TABLE idempotency_key_usage;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_body_or_ref, DROP COLUMN response_ref;
COMMIT;
