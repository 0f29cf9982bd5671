BEGIN;
-- Lists page by id (UUIDv7, so in creation order) with a cursor: the index
-- serves "this principal's payments after id X" and "this payment's refunds
-- after id X" without reading what comes before.
CREATE INDEX payments_principal_id_id_idx ON payments (principal_id, id);
CREATE INDEX refunds_payment_id_id_idx ON refunds (payment_id, id);
DROP INDEX refunds_payment_id_idx;
COMMIT;
