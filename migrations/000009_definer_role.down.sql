BEGIN;
ALTER FUNCTION add_idempotency_key_claims(uuid[], timestamptz[], bigint[]) OWNER TO CURRENT_USER;
REVOKE ALL ON idempotency_key_usage FROM payments_definer;
ALTER FUNCTION authenticate_api_key(bytea) OWNER TO CURRENT_USER;
REVOKE ALL ON api_keys FROM payments_definer;
-- The role is cluster-wide and may serve other databases: it stays.
COMMIT;
