-- The lists' horizon, from this database's transactions only (issue #34).
--
-- A list shows the rows whose creating transaction (xid, migration 13) is
-- older than every transaction that could still commit a row in front of
-- them. pg_snapshot_xmin(pg_current_snapshot()) was that bound, but it counts
-- every transaction on the server: a transaction left open in another
-- database (which can never write these tables) kept new payments and events
-- out of every list for as long as it stayed open.
--
-- list_horizon() is the oldest xid in progress at the calling statement's
-- snapshot, leaving out those that, when it runs, belong to a transaction
-- of another database. A transaction that ended between the snapshot and
-- that look (whatever its database) is kept: which database it was in can
-- no longer be told, and it holds the horizon back only until the next
-- statement. So every transaction older than the horizon that could write
-- here has ended before the snapshot, and a row it committed is visible:
-- the list still only grows at its end.
--
-- STABLE, so that pg_current_snapshot() is the calling statement's snapshot
-- (a VOLATILE function would take a new one, later than the list's, and
-- could show rows past a transaction the list cannot see yet). Call it once
-- per statement, as (SELECT list_horizon()). pg_stat_activity's datid and
-- backend_xid, which it reads, are visible to every role.
CREATE FUNCTION list_horizon() RETURNS xid8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(x)
         FROM pg_snapshot_xip(pg_current_snapshot()) AS x
         WHERE (x::text::bigint % 4294967296)::text NOT IN (
             SELECT a.backend_xid::text
             FROM pg_stat_activity a
             WHERE a.backend_xid IS NOT NULL
               AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database()))),
        pg_snapshot_xmax(pg_current_snapshot()))
$$;
REVOKE ALL ON FUNCTION list_horizon() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION list_horizon() TO payments_app, payments_maintenance;
