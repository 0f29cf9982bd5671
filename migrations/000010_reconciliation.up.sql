BEGIN;

-- An outcome the processor did not give is never guessed (issue #21). When a
-- charge's or refund's retry budget ends without a definite answer, it is
-- recorded `requires_reconciliation`: the money may or may not have moved.
-- The reconciler settles it later from the processor's own record. A refund
-- in that state keeps its amount counted in the payment's amount_refunded,
-- so the same money can never be refunded twice meanwhile.
ALTER TABLE payments
    DROP CONSTRAINT payments_status_check,
    ADD CONSTRAINT payments_status_check
        CHECK (status IN ('processing', 'succeeded', 'failed', 'requires_reconciliation'));
ALTER TABLE refunds
    DROP CONSTRAINT refunds_status_check,
    ADD CONSTRAINT refunds_status_check
        CHECK (status IN ('pending', 'succeeded', 'failed', 'requires_reconciliation'));

-- The reconciler's and the gauges' only way in: undecided rows are few, and
-- these partial indexes hold just them. They cost the worker's settling
-- UPDATE its HOT-ness on payments and refunds (the status leaves the index's
-- predicate); the key table's completion, the hot path, is untouched.
CREATE INDEX payments_undecided_idx ON payments (created_at)
    WHERE status IN ('processing', 'requires_reconciliation');
CREATE INDEX refunds_undecided_idx ON refunds (created_at)
    WHERE status IN ('pending', 'requires_reconciliation');

-- The two functions below run as payments_definer (000009), which reads the
-- undecided rows of every tenant and nothing else. The tables FORCE
-- row-level security, so it needs policies of its own: read only.
GRANT SELECT (id, principal_id, status, created_at) ON payments, refunds TO payments_definer;
CREATE POLICY payments_definer_read ON payments FOR SELECT TO payments_definer USING (true);
CREATE POLICY refunds_definer_read ON refunds FOR SELECT TO payments_definer USING (true);

-- What the reconciler must settle, across every tenant: everything in
-- `requires_reconciliation`, and everything still `processing`/`pending`
-- whose outbox job is gone or finished (discarded after its last attempt
-- failed to record, cancelled, deleted by hand), so that no payment waits
-- for a job that will never run. A row qualifies only once `grace` has
-- passed since its creation and since its job ended: a processor call the
-- job made may still be on its way, and "the processor has no record" is
-- final only after it can no longer arrive.
--
-- SECURITY DEFINER, as authenticate_api_key: the service role sees one
-- tenant at a time, yet the reconciler must find work in all of them. It gets ids, then settles each
-- row in that row's tenant like any other request. plpgsql because River's
-- tables are created after this file (by rivermigrate); river_grants.sql
-- lets payments_definer read river_job.
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
REVOKE ALL ON FUNCTION reconciliation_candidates(interval, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION reconciliation_candidates(interval, int) TO payments_app;

-- The gauges: how many wait for reconciliation, and the oldest one's age.
-- The maintenance role reads no tenant table, so it gets these two numbers
-- and nothing else.
CREATE FUNCTION reconciliation_backlog()
    RETURNS TABLE (waiting bigint, oldest_seconds float8)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
    SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
    FROM (SELECT created_at FROM payments WHERE status = 'requires_reconciliation'
          UNION ALL
          SELECT created_at FROM refunds WHERE status = 'requires_reconciliation') u
$$;
ALTER FUNCTION reconciliation_backlog() OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;
REVOKE ALL ON FUNCTION reconciliation_backlog() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION reconciliation_backlog() TO payments_maintenance;

COMMIT;
