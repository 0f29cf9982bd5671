BEGIN;

-- Ready to shard by principal (issue #25, docs/scaling.md). A distributed
-- PostgreSQL such as Citus places each row by its distribution column,
-- principal_id, and can enforce a primary key, a unique constraint or a
-- foreign key only when it contains that column: the uniqueness is then
-- checked inside one shard. idempotency_keys already is (principal_id,
-- endpoint, key); the other tenant tables are made so here. Nothing changes
-- for a client: ids stay unique (UUIDv7), and every statement of the service
-- names the principal with the id.
--
-- On a large table, build each new unique index CONCURRENTLY first, outside
-- a transaction, and swap it in with ADD CONSTRAINT ... PRIMARY KEY USING
-- INDEX: this file rebuilds them in place, which locks the tables while it
-- runs.

ALTER TABLE refunds DROP CONSTRAINT refunds_payment_id_fkey;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_endpoint_id_fkey,
                               DROP CONSTRAINT webhook_deliveries_event_id_fkey;

ALTER TABLE payments DROP CONSTRAINT payments_pkey, ADD PRIMARY KEY (principal_id, id);
ALTER TABLE refunds DROP CONSTRAINT refunds_pkey, ADD PRIMARY KEY (principal_id, id);
ALTER TABLE events DROP CONSTRAINT events_pkey, ADD PRIMARY KEY (principal_id, id);
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_pkey, ADD PRIMARY KEY (principal_id, id);
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey, ADD PRIMARY KEY (principal_id, id);

-- A refund's payment, an attempt's endpoint and event are the same
-- principal's: the foreign keys say so, and so stay inside one shard.
ALTER TABLE refunds ADD CONSTRAINT refunds_payment_fkey
    FOREIGN KEY (principal_id, payment_id) REFERENCES payments (principal_id, id);
ALTER TABLE webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_endpoint_fkey
        FOREIGN KEY (principal_id, endpoint_id) REFERENCES webhook_endpoints (principal_id, id),
    ADD CONSTRAINT webhook_deliveries_event_fkey
        FOREIGN KEY (principal_id, event_id) REFERENCES events (principal_id, id) ON DELETE CASCADE;

-- The lists and the cascade look up by principal first.
DROP INDEX refunds_payment_id_xid_id_idx;
CREATE INDEX refunds_payment_id_xid_id_idx ON refunds (principal_id, payment_id, xid, id);
DROP INDEX webhook_deliveries_endpoint_id_xid_id_idx;
CREATE INDEX webhook_deliveries_endpoint_id_xid_id_idx ON webhook_deliveries (principal_id, endpoint_id, xid, id);
DROP INDEX webhook_deliveries_event_id_idx;
CREATE INDEX webhook_deliveries_event_id_idx ON webhook_deliveries (principal_id, event_id);

-- The sweepers work one principal at a time (a statement that locks rows
-- across shards is not possible on a distributed table), so their indexes
-- lead with the principal. Replaced, not added: the key table keeps two
-- indexes, and a claim still writes two index entries.
DROP INDEX idempotency_keys_expires_at_idx;
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (principal_id, expires_at);
DROP INDEX events_created_at_idx;
CREATE INDEX events_created_at_idx ON events (principal_id, created_at);

-- The sweepers' list of principals (ids only), and the column their
-- statements now name.
GRANT SELECT (id) ON principals TO payments_maintenance;
GRANT SELECT (principal_id) ON events TO payments_maintenance;

-- The tenant as SET LOCAL rather than set_config(..., true): the same
-- transaction-local setting, but a distributed PostgreSQL sends a SET LOCAL
-- on to the nodes the transaction touches (Citus, with
-- citus.propagate_set_commands = 'local', inside a transaction block),
-- where row-level security reads it; a set_config call stays on the node
-- that ran it. SET takes no parameters; this function does, so a statement
-- that sets the tenant is one prepared statement for every principal
-- rather than one text per principal. It has no SET clause for
-- app.principal_id, so the setting outlives the call, until the
-- transaction ends. It grants nothing payments_app could not do with SET
-- itself; row-level security is what the tenant feeds.
CREATE FUNCTION set_tenant(principal uuid) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
AS $$
BEGIN
    EXECUTE format('SET LOCAL app.principal_id = %L', principal);
END
$$;
REVOKE ALL ON FUNCTION set_tenant(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION set_tenant(uuid) TO payments_app, payments_definer;

CREATE OR REPLACE FUNCTION authenticate_request(secret_hash bytea, scope text)
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
    -- Transaction-local: it ends with the transaction, and the pooled
    -- connection carries no tenant into the next one.
    PERFORM set_tenant(k.principal_id);
    RETURN QUERY SELECT k.id, k.principal_id, k.scopes;
END
$$;

COMMIT;
