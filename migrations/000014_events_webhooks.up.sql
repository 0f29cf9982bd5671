BEGIN;

-- Events and webhooks (issue #24).

-- The request that created a payment or a refund, named by its events (as
-- Stripe's `request` field): the request id of the attempt that executed,
-- and the Idempotency-Key it carried. Rows older than this migration have
-- none.
ALTER TABLE payments ADD COLUMN request_id text CHECK (length(request_id) <= 200),
                     ADD COLUMN idempotency_key text CHECK (length(idempotency_key) <= 255);
ALTER TABLE refunds ADD COLUMN request_id text CHECK (length(request_id) <= 200),
                    ADD COLUMN idempotency_key text CHECK (length(idempotency_key) <= 255);

-- An event records one status change of a payment or a refund, with a
-- snapshot of the object as it became. It is inserted by the statement that
-- makes the change (payments.settleSQL, refunds.settleSQL), so it exists if
-- and only if the change committed. Events are never updated; the sweeper
-- deletes them 30 days after they were made (the retention docs/webhooks.md
-- and openapi.yaml publish).
CREATE TABLE events (
    id              uuid        PRIMARY KEY,
    principal_id    uuid        NOT NULL,
    type            text        NOT NULL CHECK (type IN (
                        'payment.succeeded', 'payment.failed', 'payment.requires_reconciliation',
                        'refund.succeeded', 'refund.failed', 'refund.requires_reconciliation')),
    data            json        NOT NULL, -- as the service rendered it: GET shows the object in its own field order
    request_id      text,
    idempotency_key text,
    livemode        boolean     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The list's order, final when an event becomes visible (000013).
    xid             xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX events_principal_id_xid_id_idx ON events (principal_id, xid, id);
CREATE INDEX events_created_at_idx ON events (created_at); -- the sweep

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY events_tenant ON events
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);
GRANT SELECT, INSERT ON events TO payments_app;
-- The maintenance role deletes events past their retention and can do
-- nothing else with them: PostgreSQL refuses a younger one.
CREATE POLICY events_maintenance_read ON events
    FOR SELECT TO payments_maintenance
    USING (true);
CREATE POLICY events_maintenance_expire ON events
    FOR DELETE TO payments_maintenance
    USING (created_at < now() - interval '30 days');
GRANT SELECT (id, created_at), DELETE ON events TO payments_maintenance;

-- A client's webhook endpoint. Its signing secret is not stored anywhere:
-- the service derives it from WEBHOOK_SIGNING_KEY, the endpoint's id and
-- secret_version (package webhooks), so no query of any role can read it
-- back. A rotation counts secret_version up; the previous version keeps
-- being signed with until previous_secret_expires_at.
CREATE TABLE webhook_endpoints (
    id                         uuid        PRIMARY KEY,
    principal_id               uuid        NOT NULL,
    url                        text        NOT NULL CHECK (length(url) <= 2048),
    description                text        CHECK (length(description) <= 1000),
    status                     text        NOT NULL CHECK (status IN ('enabled', 'disabled', 'deleted')),
    secret_version             int         NOT NULL DEFAULT 1 CHECK (secret_version >= 1),
    previous_secret_expires_at timestamptz,
    created_at                 timestamptz NOT NULL,
    xid                        xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX webhook_endpoints_principal_id_xid_id_idx ON webhook_endpoints (principal_id, xid, id);

-- Every attempt to deliver an event to an endpoint, listable per endpoint.
CREATE TABLE webhook_deliveries (
    id           uuid        PRIMARY KEY,
    principal_id uuid        NOT NULL,
    endpoint_id  uuid        NOT NULL REFERENCES webhook_endpoints (id),
    event_id     uuid        NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    attempt      int         NOT NULL CHECK (attempt >= 1),
    status_code  int,        -- the receiver's answer; NULL when none came
    error        text        CHECK (length(error) <= 500),
    duration_ms  int         NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    xid          xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX webhook_deliveries_endpoint_id_xid_id_idx ON webhook_deliveries (endpoint_id, xid, id);
CREATE INDEX webhook_deliveries_event_id_idx ON webhook_deliveries (event_id); -- the cascade

ALTER TABLE webhook_endpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_endpoints FORCE ROW LEVEL SECURITY;
CREATE POLICY webhook_endpoints_tenant ON webhook_endpoints
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);
ALTER TABLE webhook_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_deliveries FORCE ROW LEVEL SECURITY;
CREATE POLICY webhook_deliveries_tenant ON webhook_deliveries
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);
GRANT SELECT, INSERT ON webhook_endpoints, webhook_deliveries TO payments_app;
GRANT UPDATE (status, secret_version, previous_secret_expires_at) ON webhook_endpoints TO payments_app;

COMMIT;
