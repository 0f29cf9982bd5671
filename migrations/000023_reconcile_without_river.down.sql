BEGIN;
DROP FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int);
CREATE FUNCTION reconciliation_candidates(grace interval, max_rows int)
    RETURNS TABLE (kind text, id uuid, principal_id uuid, status text, created_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    RETURN QUERY
    (SELECT 'payment', p.id, p.principal_id, p.status, p.created_at
     FROM payments p
     WHERE p.status IN ('processing', 'requires_reconciliation')
       AND p.created_at < now() - grace
       AND NOT EXISTS (
           SELECT 1 FROM river_job j
           WHERE j.kind = 'charge_payment' AND j.args @> jsonb_build_object('payment_id', p.id)
             AND (j.finalized_at IS NULL OR j.finalized_at > now() - grace))
     ORDER BY p.created_at LIMIT max_rows)
    UNION ALL
    (SELECT 'refund', r.id, r.principal_id, r.status, r.created_at
     FROM refunds r
     WHERE r.status IN ('pending', 'requires_reconciliation')
       AND r.created_at < now() - grace
       AND NOT EXISTS (
           SELECT 1 FROM river_job j
           WHERE j.kind = 'refund_payment' AND j.args @> jsonb_build_object('refund_id', r.id)
             AND (j.finalized_at IS NULL OR j.finalized_at > now() - grace))
     ORDER BY r.created_at LIMIT max_rows);
END
$$;
GRANT CREATE ON SCHEMA public TO payments_definer; -- for the handover (000009)
ALTER FUNCTION reconciliation_candidates(interval, int) OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;
REVOKE ALL ON FUNCTION reconciliation_candidates(interval, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION reconciliation_candidates(interval, int) TO payments_app;
COMMIT;
