BEGIN;

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
    PERFORM set_config('app.principal_id', k.principal_id::text, true);
    RETURN QUERY SELECT k.id, k.principal_id, k.scopes;
END
$$;

DROP FUNCTION set_tenant(uuid);

REVOKE SELECT (principal_id) ON events FROM payments_maintenance;
REVOKE SELECT (id) ON principals FROM payments_maintenance;

DROP INDEX events_created_at_idx;
CREATE INDEX events_created_at_idx ON events (created_at);
DROP INDEX idempotency_keys_expires_at_idx;
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
DROP INDEX webhook_deliveries_event_id_idx;
CREATE INDEX webhook_deliveries_event_id_idx ON webhook_deliveries (event_id);
DROP INDEX webhook_deliveries_endpoint_id_xid_id_idx;
CREATE INDEX webhook_deliveries_endpoint_id_xid_id_idx ON webhook_deliveries (endpoint_id, xid, id);
DROP INDEX refunds_payment_id_xid_id_idx;
CREATE INDEX refunds_payment_id_xid_id_idx ON refunds (payment_id, xid, id);

ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_event_fkey,
                               DROP CONSTRAINT webhook_deliveries_endpoint_fkey;
ALTER TABLE refunds DROP CONSTRAINT refunds_payment_fkey;

ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey, ADD PRIMARY KEY (id);
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_pkey, ADD PRIMARY KEY (id);
ALTER TABLE events DROP CONSTRAINT events_pkey, ADD PRIMARY KEY (id);
ALTER TABLE refunds DROP CONSTRAINT refunds_pkey, ADD PRIMARY KEY (id);
ALTER TABLE payments DROP CONSTRAINT payments_pkey, ADD PRIMARY KEY (id);

ALTER TABLE refunds ADD CONSTRAINT refunds_payment_id_fkey FOREIGN KEY (payment_id) REFERENCES payments (id);
ALTER TABLE webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES webhook_endpoints (id),
    ADD CONSTRAINT webhook_deliveries_event_id_fkey FOREIGN KEY (event_id) REFERENCES events (id) ON DELETE CASCADE;

COMMIT;
