BEGIN;

-- A request's first statement, in its transaction's first round trip
-- (issue #23): it finds the live API key whose secret hashes to
-- secret_hash, checks that the key holds scope, and sets the transaction's
-- tenant to the key's principal. So the tenant comes from the key, in the
-- database, rather than from a value the service passes back in; and a
-- request that is refused runs nothing after it, since the error aborts
-- the transaction.
--
-- The errors have codes of their own, so the service cannot mistake them
-- for another failure (42501 is also row-level security's): PA401 means no
-- live key has this secret, PA403 that the key lacks the scope (its message
-- names it).
CREATE FUNCTION authenticate_request(secret_hash bytea, scope text)
    RETURNS TABLE (key_id uuid, principal_id uuid, scopes text[])
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
DECLARE
    k record;
BEGIN
    SELECT a.id, a.principal_id, a.scopes INTO k
    FROM api_keys a
    WHERE a.secret_hash = authenticate_request.secret_hash AND a.revoked_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unauthenticated' USING ERRCODE = 'PA401';
    END IF;
    IF NOT authenticate_request.scope = ANY (k.scopes) THEN
        RAISE EXCEPTION 'missing scope %', authenticate_request.scope USING ERRCODE = 'PA403';
    END IF;
    -- Transaction-local (true): it ends with the transaction, and the
    -- pooled connection carries no tenant into the next one. The function
    -- has no SET clause for it, so the setting outlives the call.
    PERFORM set_config('app.principal_id', k.principal_id::text, true);
    RETURN QUERY SELECT k.id, k.principal_id, k.scopes;
END
$$;
REVOKE ALL ON FUNCTION authenticate_request(bytea, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION authenticate_request(bytea, text) TO payments_app;
GRANT CREATE ON SCHEMA public TO payments_definer;
ALTER FUNCTION authenticate_request(bytea, text) OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;

-- The function it replaces: the service authenticated with it in a round
-- trip of its own, before the transaction.
DROP FUNCTION authenticate_api_key(bytea);

COMMIT;
