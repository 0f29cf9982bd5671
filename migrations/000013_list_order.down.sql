BEGIN;
CREATE INDEX payments_principal_id_id_idx ON payments (principal_id, id);
CREATE INDEX refunds_payment_id_id_idx ON refunds (payment_id, id);
DROP INDEX refunds_payment_id_xid_id_idx;
DROP INDEX payments_principal_id_xid_id_idx;
ALTER TABLE refunds DROP COLUMN xid;
ALTER TABLE payments DROP COLUMN xid;
COMMIT;
