BEGIN;
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
GRANT CREATE ON SCHEMA public TO payments_definer;
ALTER FUNCTION authenticate_api_key(bytea) OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;
DROP FUNCTION authenticate_request(bytea, text);
COMMIT;
