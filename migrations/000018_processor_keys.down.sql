ALTER TABLE refunds DROP COLUMN processor_key, DROP COLUMN charge_key;
ALTER TABLE payments DROP COLUMN processor_key;
