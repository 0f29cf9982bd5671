BEGIN;

-- Webhook operations (issue #34, item 6).

-- enabled_events: the event types an endpoint is sent ('*': every type,
-- the default, as before). disabled_reason says why a disabled endpoint
-- is: its receiver answered 410 Gone, it failed for WEBHOOK_DISABLE_AFTER,
-- or its owner disabled it. failing_since is when its current run of
-- failed attempts began (NULL after a delivered one). disable_event_id is
-- the webhook_endpoint.disabled event of the last automatic disabling: the
-- event's INSERT ... SELECT reads the endpoint only where the UPDATE that
-- disabled it set that id, as a settle's event does (migration 20).
ALTER TABLE webhook_endpoints
    ADD COLUMN enabled_events   text[]      NOT NULL DEFAULT '{*}'
        CHECK (cardinality(enabled_events) BETWEEN 1 AND 16),
    ADD COLUMN disabled_reason  text        CHECK (disabled_reason IN ('receiver_gone', 'failing', 'requested')),
    ADD COLUMN failing_since    timestamptz,
    ADD COLUMN disable_event_id uuid;
UPDATE webhook_endpoints SET disabled_reason = 'receiver_gone' WHERE status = 'disabled';
GRANT UPDATE (description, enabled_events, disabled_reason, failing_since, disable_event_id) ON webhook_endpoints TO payments_app;

ALTER TABLE events DROP CONSTRAINT events_type_check, ADD CONSTRAINT events_type_check CHECK (type IN (
    'payment.succeeded', 'payment.failed', 'payment.requires_reconciliation',
    'refund.succeeded', 'refund.failed', 'refund.requires_reconciliation',
    'webhook_endpoint.disabled'));

-- A delivery attempt in flight to an endpoint holds a lease, so that at
-- most WEBHOOK_ENDPOINT_CONCURRENCY attempts to one endpoint run at once,
-- across every instance. A lease whose worker died ends at expires_at.
CREATE TABLE webhook_endpoint_leases (
    principal_id uuid        NOT NULL,
    endpoint_id  uuid        NOT NULL,
    job_id       bigint      NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (principal_id, endpoint_id, job_id),
    FOREIGN KEY (principal_id, endpoint_id) REFERENCES webhook_endpoints (principal_id, id)
);
ALTER TABLE webhook_endpoint_leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_endpoint_leases FORCE ROW LEVEL SECURITY;
CREATE POLICY webhook_endpoint_leases_tenant ON webhook_endpoint_leases
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);
GRANT SELECT, INSERT, DELETE ON webhook_endpoint_leases TO payments_app;
GRANT UPDATE (expires_at) ON webhook_endpoint_leases TO payments_app;

COMMIT;
