BEGIN;

-- The service role gets what its requests need and no more.

-- Authentication. The service finds a key by its secret's hash through this
-- function and cannot read api_keys or principals at all: a bug or an
-- injection in the service cannot list other tenants' keys, hashes or names.
-- SECURITY DEFINER runs it as the tables' owner. Its search_path puts pg_temp
-- last, so a temporary table the caller creates cannot stand in for api_keys.
CREATE FUNCTION authenticate_api_key(secret_hash bytea)
    RETURNS TABLE (key_id uuid, principal_id uuid, scopes text[])
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
    SELECT k.id, k.principal_id, k.scopes
    FROM api_keys k
    WHERE k.secret_hash = authenticate_api_key.secret_hash AND k.revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION authenticate_api_key(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION authenticate_api_key(bytea) TO payments_app;
REVOKE SELECT ON principals, api_keys FROM payments_app;

-- A payment's only change after it is created is what has been refunded.
REVOKE UPDATE ON payments FROM payments_app;
GRANT UPDATE (amount_refunded) ON payments TO payments_app;

-- A key's scope never changes: completing a claim, or taking over an expired
-- row, rewrites everything but (principal_id, endpoint, key).
REVOKE UPDATE ON idempotency_keys FROM payments_app;
GRANT UPDATE (state, fingerprint, response_status, response_content_type, response_body,
              response_ref, correlation_id, trace_parent, created_at, expires_at)
    ON idempotency_keys TO payments_app;

-- Quota usage. The service only ever adds its claims to an hourly bucket, for
-- many principals in one statement, so it does so through this function and
-- cannot insert or update rows itself: it cannot lower a count (to escape a
-- quota), write a bucket in the future or a negative count. It can still add
-- claims to any principal's current buckets: a flush covers many tenants, and
-- a role that sets its own tenant could not be stopped by row-level security
-- anyway (docs/reliability.md, "Roles").
CREATE FUNCTION add_idempotency_key_claims(principals uuid[], buckets timestamptz[], claims bigint[])
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    IF cardinality(principals) <> cardinality(buckets) OR cardinality(buckets) <> cardinality(claims) THEN
        RAISE EXCEPTION 'add_idempotency_key_claims: arrays of different lengths' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (
        SELECT 1 FROM unnest(buckets, claims) AS u(b, c)
        WHERE c IS NULL OR c <= 0 OR b IS NULL
           OR extract(epoch FROM b)::numeric % 3600 <> 0
           OR b > now() + interval '1 hour'
    ) THEN
        RAISE EXCEPTION 'add_idempotency_key_claims: claims must be positive, buckets whole hours, none in the future'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO idempotency_key_usage AS u (principal_id, bucket, claims)
    SELECT * FROM unnest(principals, buckets, claims)
    ON CONFLICT (principal_id, bucket) DO UPDATE SET claims = u.claims + EXCLUDED.claims;
END
$$;
REVOKE ALL ON FUNCTION add_idempotency_key_claims(uuid[], timestamptz[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION add_idempotency_key_claims(uuid[], timestamptz[], bigint[]) TO payments_app;
REVOKE INSERT, UPDATE ON idempotency_key_usage FROM payments_app;

COMMIT;
