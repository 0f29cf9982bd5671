-- A refund keeps its charge's id at the processor (issue #35), as it keeps
-- its charge's key: some processors name the charge to refund only by their
-- own id (Stripe's payment_intent), and cannot find it by our key at once
-- (Stripe's search lags its writes). A refund is only made of a succeeded
-- payment, which has its processor_id; rows from before are filled in.
ALTER TABLE refunds ADD COLUMN charge_id text;
UPDATE refunds r SET charge_id = coalesce(p.processor_id, '')
FROM payments p WHERE p.principal_id = r.principal_id AND p.id = r.payment_id;
ALTER TABLE refunds ALTER COLUMN charge_id SET NOT NULL,
    ADD CONSTRAINT refunds_charge_id_length CHECK (length(charge_id) <= 100);
