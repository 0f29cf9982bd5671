BEGIN;

-- What has been refunded so far, kept on the payment so that the rule "refunds
-- never exceed the payment" is one CHECK on one row. The refund transaction
-- locks this row, so the CHECK is a backstop that only a bug could reach.
ALTER TABLE payments
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payments_refunds_within_amount
        CHECK (amount_refunded >= 0 AND amount_refunded <= amount);

CREATE TABLE refunds (
    id           uuid        PRIMARY KEY,
    principal_id uuid        NOT NULL,
    payment_id   uuid        NOT NULL REFERENCES payments (id),
    amount       bigint      NOT NULL CHECK (amount > 0),
    currency     text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    reason       text        CHECK (reason IN ('requested_by_customer', 'duplicate', 'fraudulent')),
    status       text        NOT NULL CHECK (status IN ('succeeded')),
    created_at   timestamptz NOT NULL
);

CREATE INDEX refunds_payment_id_idx ON refunds (payment_id, created_at, id);

ALTER TABLE refunds ENABLE ROW LEVEL SECURITY;
ALTER TABLE refunds FORCE ROW LEVEL SECURITY;
CREATE POLICY refunds_tenant ON refunds
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);

GRANT SELECT, INSERT ON refunds TO payments_app;

COMMIT;
