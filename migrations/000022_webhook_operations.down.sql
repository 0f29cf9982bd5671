BEGIN;
DROP TABLE webhook_endpoint_leases;
DELETE FROM events WHERE type = 'webhook_endpoint.disabled';
ALTER TABLE events DROP CONSTRAINT events_type_check, ADD CONSTRAINT events_type_check CHECK (type IN (
    'payment.succeeded', 'payment.failed', 'payment.requires_reconciliation',
    'refund.succeeded', 'refund.failed', 'refund.requires_reconciliation'));
REVOKE UPDATE (description, enabled_events, disabled_reason, failing_since, disable_event_id) ON webhook_endpoints FROM payments_app;
ALTER TABLE webhook_endpoints DROP COLUMN enabled_events, DROP COLUMN disabled_reason,
    DROP COLUMN failing_since, DROP COLUMN disable_event_id;
COMMIT;
