BEGIN;
-- Jobs still waiting for the relay go to River first: nothing is lost.
DO $$
BEGIN
    IF to_regclass('river_job') IS NOT NULL THEN
        INSERT INTO river_job (args, kind, max_attempts, metadata, queue, state)
        SELECT args, kind, max_attempts, metadata, queue, 'available' FROM outbox_jobs ORDER BY created_at, id;
    END IF;
END
$$;
DROP FUNCTION outbox_pending(int);
DROP FUNCTION outbox_relayed(uuid[], uuid[]);
DROP FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int);
CREATE FUNCTION reconciliation_candidates(grace interval, after_created timestamptz, after_id uuid, max_rows int)
    RETURNS TABLE (kind text, id uuid, principal_id uuid, status text, created_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
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
GRANT CREATE ON SCHEMA public TO payments_definer;
ALTER FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;
REVOKE ALL ON FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) TO payments_app;
DROP TABLE outbox_jobs;
COMMIT;
