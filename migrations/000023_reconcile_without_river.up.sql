BEGIN;

-- The reconciler's candidates without River's table (issue #33). The
-- function of migration 10 joined the tenant tables with river_job to leave
-- out rows whose job is live; on Citus the tenant tables are distributed and
-- river_job is the coordinator's own table, and Citus refuses that join
-- ("direct joins between distributed and local tables are not supported"),
-- so the reconciler could not run at all. The function now reads the
-- tenant tables only, a page at a time in (created_at, id) order, and the
-- reconciler asks River's table about each row it returns (outbox.Live).
-- On Citus the read runs on every shard, as the operator's cross-tenant
-- read that docs/scaling.md names.
DROP FUNCTION reconciliation_candidates(interval, int);
CREATE FUNCTION reconciliation_candidates(grace interval, after_created timestamptz, after_id uuid, max_rows int)
    RETURNS TABLE (kind text, id uuid, principal_id uuid, status text, created_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: Citus cannot plan a SQL function's parameters.
    RETURN QUERY
    SELECT c.kind, c.id, c.principal_id, c.status, c.created_at FROM (
        (SELECT 'payment', p.id, p.principal_id, p.status, p.created_at
         FROM payments p
         WHERE p.status IN ('processing', 'requires_reconciliation')
           AND p.created_at < now() - grace
           AND (p.created_at, p.id) > (after_created, after_id)
         ORDER BY p.created_at, p.id LIMIT max_rows)
        UNION ALL
        (SELECT 'refund', r.id, r.principal_id, r.status, r.created_at
         FROM refunds r
         WHERE r.status IN ('pending', 'requires_reconciliation')
           AND r.created_at < now() - grace
           AND (r.created_at, r.id) > (after_created, after_id)
         ORDER BY r.created_at, r.id LIMIT max_rows)
    ) AS c (kind, id, principal_id, status, created_at)
    ORDER BY c.created_at, c.id LIMIT max_rows;
END
$$;
GRANT CREATE ON SCHEMA public TO payments_definer; -- for the handover (000009)
ALTER FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;
REVOKE ALL ON FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) TO payments_app;

COMMIT;
