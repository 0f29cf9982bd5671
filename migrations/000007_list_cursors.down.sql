BEGIN;
CREATE INDEX refunds_payment_id_idx ON refunds (payment_id, created_at, id);
DROP INDEX refunds_payment_id_id_idx;
DROP INDEX payments_principal_id_id_idx;
COMMIT;
