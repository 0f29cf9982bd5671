-- The processor's idempotency key of a charge or a refund, kept on its row
-- (issue #35). It was the row's id: a payment whose commit was lost after
-- its charge went out (a lossy failover) was created again by the client's
-- retry under a new id, and charged again. Now it is derived from the
-- client's intent, which survives a lost commit: the principal, the route,
-- the Idempotency-Key and the request's fingerprint (idempotency.IntentKey).
-- A refund also keeps its charge's key, which the processor refunds.
--
-- Rows from before keep the keys they were charged with, their ids, so
-- that a job still to run, and the reconciler, ask the processor about the
-- key it knows.
ALTER TABLE payments ADD COLUMN processor_key text;
UPDATE payments SET processor_key = id::text;
ALTER TABLE payments ALTER COLUMN processor_key SET NOT NULL,
    ADD CONSTRAINT payments_processor_key_length CHECK (length(processor_key) <= 255);

ALTER TABLE refunds ADD COLUMN processor_key text, ADD COLUMN charge_key text;
UPDATE refunds r SET processor_key = r.id::text, charge_key = p.processor_key
FROM payments p WHERE p.principal_id = r.principal_id AND p.id = r.payment_id;
ALTER TABLE refunds ALTER COLUMN processor_key SET NOT NULL, ALTER COLUMN charge_key SET NOT NULL,
    ADD CONSTRAINT refunds_processor_key_length CHECK (length(processor_key) <= 255 AND length(charge_key) <= 255);
