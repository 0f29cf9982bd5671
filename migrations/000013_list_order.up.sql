BEGIN;

-- The lists' order, final when a row becomes visible (issue #24). A row's
-- id (UUIDv7) is made before its transaction commits, so ordered by id, a
-- payment that commits after a later one lands behind a cursor that has
-- already passed it: a client following starting_after never sees it.
-- Ordered instead by the inserting transaction's id, and showing only rows
-- whose transaction is older than every transaction still running
-- (pg_snapshot_xmin of the statement's snapshot), a list only ever grows at
-- its end: every transaction older than that horizon has ended, and every
-- one still to commit has a larger id.
ALTER TABLE payments ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE refunds ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX payments_principal_id_xid_id_idx ON payments (principal_id, xid, id);
CREATE INDEX refunds_payment_id_xid_id_idx ON refunds (payment_id, xid, id);
DROP INDEX payments_principal_id_id_idx;
DROP INDEX refunds_payment_id_id_idx;

COMMIT;
