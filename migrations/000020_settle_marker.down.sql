REVOKE UPDATE (settle_event_id) ON refunds FROM payments_app;
REVOKE UPDATE (settle_event_id) ON payments FROM payments_app;
ALTER TABLE refunds DROP COLUMN settle_event_id;
ALTER TABLE payments DROP COLUMN settle_event_id;
