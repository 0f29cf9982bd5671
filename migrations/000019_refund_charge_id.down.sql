ALTER TABLE refunds DROP COLUMN charge_id;
