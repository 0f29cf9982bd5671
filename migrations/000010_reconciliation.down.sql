BEGIN;
DROP FUNCTION reconciliation_backlog();
DROP FUNCTION reconciliation_candidates(interval, int);
DROP POLICY refunds_definer_read ON refunds;
DROP POLICY payments_definer_read ON payments;
REVOKE SELECT (id, principal_id, status, created_at) ON payments, refunds FROM payments_definer;
DROP INDEX refunds_undecided_idx;
DROP INDEX payments_undecided_idx;
-- Rows in requires_reconciliation cannot be represented before this
-- migration: the constraints below then fail, and the down migration is
-- refused rather than guess their outcome.
ALTER TABLE refunds
    DROP CONSTRAINT refunds_status_check,
    ADD CONSTRAINT refunds_status_check CHECK (status IN ('pending', 'succeeded', 'failed'));
ALTER TABLE payments
    DROP CONSTRAINT payments_status_check,
    ADD CONSTRAINT payments_status_check CHECK (status IN ('processing', 'succeeded', 'failed'));
COMMIT;
