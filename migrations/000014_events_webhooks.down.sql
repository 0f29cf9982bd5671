BEGIN;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
DROP TABLE events;
ALTER TABLE refunds DROP COLUMN idempotency_key, DROP COLUMN request_id;
ALTER TABLE payments DROP COLUMN idempotency_key, DROP COLUMN request_id;
COMMIT;
