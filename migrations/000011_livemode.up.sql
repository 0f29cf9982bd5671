BEGIN;

-- Test mode, visible (issue #21): a payment charged through the simulator
-- moved no money, and says so in its JSON (`livemode: false`, as Stripe's
-- objects do), for ever, whatever processor the service uses later. A refund
-- inherits its payment's mode. The service always writes the column; the
-- default (test mode) covers the rows from before this migration, when every
-- default deployment charged the simulator, and rows written by hand. A
-- deployment that already charged a real processor sets its rows true.
ALTER TABLE payments ADD COLUMN livemode boolean NOT NULL DEFAULT false;
ALTER TABLE refunds ADD COLUMN livemode boolean NOT NULL DEFAULT false;

COMMIT;
