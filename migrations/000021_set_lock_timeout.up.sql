-- set_lock_timeout sets lock_timeout until the transaction ends, as SET
-- LOCAL does, from inside a function (issue #33). Citus passes a SET LOCAL
-- on to the workers a transaction touches by replaying the text of the
-- query that ran it; a BEGIN sent with its SET LOCALs in one query string
-- (one round trip) was replayed whole inside the worker's transaction, and
-- every worker logged "there is already a transaction in progress" once per
-- transaction. Inside a function, the replayed text is the SET alone, as
-- set_tenant's is (migration 15). The lock timeout must reach the workers:
-- a claim waits for a concurrent attempt's row lock there.
CREATE FUNCTION set_lock_timeout(milliseconds bigint) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = public, pg_temp
AS $$
BEGIN
    EXECUTE format('SET LOCAL lock_timeout = %s', milliseconds);
END
$$;
REVOKE ALL ON FUNCTION set_lock_timeout(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION set_lock_timeout(bigint) TO payments_app, payments_maintenance;
