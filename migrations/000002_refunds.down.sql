BEGIN;
DROP TABLE refunds;
ALTER TABLE payments DROP CONSTRAINT payments_refunds_within_amount, DROP COLUMN amount_refunded;
COMMIT;
