BEGIN;

-- Test mode, visible (issue #21): a payment charged through the simulator
-- moved no money, and says so in its JSON (`livemode: false`, as Stripe's
-- objects do), for ever, whatever processor the service uses later. A refund
-- inherits its payment's mode. Rows from before this migration are marked
-- test mode: until now every default deployment charged the simulator. A
-- deployment that already charged a real processor sets them true by hand.
ALTER TABLE payments ADD COLUMN livemode boolean NOT NULL DEFAULT false;
ALTER TABLE payments ALTER COLUMN livemode DROP DEFAULT;
ALTER TABLE refunds ADD COLUMN livemode boolean NOT NULL DEFAULT false;
ALTER TABLE refunds ALTER COLUMN livemode DROP DEFAULT;

COMMIT;
