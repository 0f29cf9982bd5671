BEGIN;

-- The SECURITY DEFINER functions run with their owner's rights. Owned by the
-- migrating role (a superuser in a default install), a bug in one of them
-- would run with rights that bypass every policy. They belong instead to a
-- role of their own that cannot log in and holds exactly what the functions
-- read and write (issue #21): a flaw in a function cannot reach further.
DO $$
BEGIN
    CREATE ROLE payments_definer NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;
-- Only a member may hand an object to a role: the migrating role joins it.
-- A new owner also needs CREATE on the schema at the moment of the handover,
-- which the migrations grant around each ALTER ... OWNER and take back.
GRANT payments_definer TO CURRENT_USER;
GRANT CREATE ON SCHEMA public TO payments_definer;

-- authenticate_api_key reads keys by their secret's hash.
GRANT SELECT ON api_keys TO payments_definer;
ALTER FUNCTION authenticate_api_key(bytea) OWNER TO payments_definer;

-- add_idempotency_key_claims adds to the hourly buckets.
GRANT SELECT, INSERT, UPDATE ON idempotency_key_usage TO payments_definer;
ALTER FUNCTION add_idempotency_key_claims(uuid[], timestamptz[], bigint[]) OWNER TO payments_definer;

REVOKE CREATE ON SCHEMA public FROM payments_definer;

COMMIT;
