BEGIN;
REVOKE UPDATE (status, failure_reason, processor_id) ON refunds FROM payments_app;
REVOKE UPDATE (status, failure_reason, processor_id) ON payments FROM payments_app;
DELETE FROM refunds WHERE status <> 'succeeded';
ALTER TABLE refunds
    DROP CONSTRAINT refunds_failure_reason_iff_failed,
    DROP COLUMN processor_id,
    DROP COLUMN failure_reason,
    DROP CONSTRAINT refunds_status_check,
    ADD CONSTRAINT refunds_status_check CHECK (status IN ('succeeded'));
ALTER TABLE payments
    DROP CONSTRAINT payments_failure_reason_iff_failed,
    DROP COLUMN processor_id,
    DROP COLUMN failure_reason,
    DROP CONSTRAINT payments_status_check;
DELETE FROM payments WHERE status <> 'succeeded';
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN ('succeeded'));
COMMIT;
