-- A settle writes its status change and the event that says so as
-- separate statements of one batch (issue #33): Citus plans an event
-- INSERT fed by a modifying CTE by pulling rows to the coordinator and
-- copying them back, which row-level security refuses. settle_event_id is
-- the id of the event the last status change recorded: the UPDATE sets it
-- to the event's fresh id, and the event's INSERT ... SELECT reads the row
-- only where it carries that id, so the event exists if and only if that
-- UPDATE changed the row, as one statement guaranteed before.
ALTER TABLE payments ADD COLUMN settle_event_id uuid;
ALTER TABLE refunds ADD COLUMN settle_event_id uuid;
GRANT UPDATE (settle_event_id) ON payments TO payments_app;
GRANT UPDATE (settle_event_id) ON refunds TO payments_app;
