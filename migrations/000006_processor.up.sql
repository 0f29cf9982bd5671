BEGIN;

-- A payment is charged by a processor after its request commits, through the
-- outbox (a River job inserted in the request's transaction): it is
-- `processing` until the worker records the processor's answer.
ALTER TABLE payments
    DROP CONSTRAINT payments_status_check,
    ADD CONSTRAINT payments_status_check CHECK (status IN ('processing', 'succeeded', 'failed')),
    ADD COLUMN failure_reason text CHECK (length(failure_reason) <= 100),
    ADD COLUMN processor_id text CHECK (length(processor_id) <= 100),
    ADD CONSTRAINT payments_failure_reason_iff_failed CHECK ((status = 'failed') = (failure_reason IS NOT NULL));

-- A refund likewise is `pending` until the processor answers. Its amount is
-- counted in the payment's amount_refunded from the start, so pending refunds
-- count against what remains; a failed refund gives it back.
ALTER TABLE refunds
    DROP CONSTRAINT refunds_status_check,
    ADD CONSTRAINT refunds_status_check CHECK (status IN ('pending', 'succeeded', 'failed')),
    ADD COLUMN failure_reason text CHECK (length(failure_reason) <= 100),
    ADD COLUMN processor_id text CHECK (length(processor_id) <= 100),
    ADD CONSTRAINT refunds_failure_reason_iff_failed CHECK ((status = 'failed') = (failure_reason IS NOT NULL));

-- The worker settles them as the service role, with the tenant set, and
-- changes nothing else.
GRANT UPDATE (status, failure_reason, processor_id) ON payments TO payments_app;
GRANT UPDATE (status, failure_reason, processor_id) ON refunds TO payments_app;

COMMIT;
