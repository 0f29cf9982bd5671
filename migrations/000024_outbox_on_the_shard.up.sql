BEGIN;

-- The outbox on the payment's shard (issue #33). A request used to insert
-- its job (a charge, a refund) straight into River's river_job, in its own
-- transaction: atomic on one server, but on Citus river_job is the
-- coordinator's table and the payment is on a worker, and the two commit
-- one after the other. A crash between them left a payment processing
-- with no job. A job is now a row of outbox_jobs, distributed like the
-- payment (migrations/citus.sql), written in the payment's own
-- single-shard transaction; the relay (internal/outbox, Relay) copies it
-- into River and then deletes it. The copy carries a unique key made from
-- the row's id, so a relay that dies between the two enqueues nothing twice.
CREATE TABLE outbox_jobs (
    principal_id uuid        NOT NULL,
    id           uuid        NOT NULL,
    kind         text        NOT NULL,
    queue        text        NOT NULL,
    args         jsonb       NOT NULL,
    metadata     jsonb       NOT NULL DEFAULT '{}',
    max_attempts smallint    NOT NULL CHECK (max_attempts > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal_id, id)
);
-- The relay reads the oldest first. No index on args (River's table has
-- two GIN indexes): rows live here for a relay's pass, so the reconciler's
-- look for a payment's waiting job reads the few rows of one principal.
CREATE INDEX outbox_jobs_created_at ON outbox_jobs (created_at, id);

ALTER TABLE outbox_jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE outbox_jobs FORCE ROW LEVEL SECURITY;
CREATE POLICY outbox_jobs_tenant ON outbox_jobs
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);
-- A request only adds jobs; only the relay's functions read and delete them.
GRANT INSERT ON outbox_jobs TO payments_app;
CREATE POLICY outbox_jobs_definer_read ON outbox_jobs FOR SELECT TO payments_definer USING (true);
CREATE POLICY outbox_jobs_definer_relayed ON outbox_jobs FOR DELETE TO payments_definer USING (true);
GRANT SELECT, DELETE ON outbox_jobs TO payments_definer;
-- The gauges (maintenance role) read how many wait and since when, no more.
CREATE POLICY outbox_jobs_maintenance_read ON outbox_jobs FOR SELECT TO payments_maintenance USING (true);
GRANT SELECT (created_at) ON outbox_jobs TO payments_maintenance;

-- The relay's two cross-tenant statements, as functions of the definer
-- role, so that the service role itself reads no other tenant's rows. On
-- Citus they run on every shard: docs/scaling.md names them. plpgsql, not
-- sql: Citus cannot plan a SQL function's parameters.
CREATE FUNCTION outbox_pending(max_rows int)
    RETURNS TABLE (principal_id uuid, id uuid, kind text, queue text, args jsonb, metadata jsonb,
                   max_attempts smallint, created_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT o.principal_id, o.id, o.kind, o.queue, o.args, o.metadata, o.max_attempts, o.created_at
    FROM outbox_jobs o ORDER BY o.created_at, o.id LIMIT max_rows;
END
$$;
CREATE FUNCTION outbox_relayed(principals uuid[], ids uuid[])
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    -- principal_id = ANY: on Citus, only the shards of these principals.
    DELETE FROM outbox_jobs WHERE principal_id = ANY (principals) AND id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- The reconciler's candidates leave out a row whose job has not reached
-- River yet: it is not lost, only waiting for the relay.
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
           AND NOT EXISTS (SELECT FROM outbox_jobs o
                           WHERE o.principal_id = p.principal_id
                             AND o.args @> jsonb_build_object('payment_id', p.id))
         ORDER BY p.created_at, p.id LIMIT max_rows)
        UNION ALL
        (SELECT 'refund', r.id, r.principal_id, r.status, r.created_at
         FROM refunds r
         WHERE r.status IN ('pending', 'requires_reconciliation')
           AND r.created_at < now() - grace
           AND (r.created_at, r.id) > (after_created, after_id)
           AND NOT EXISTS (SELECT FROM outbox_jobs o
                           WHERE o.principal_id = r.principal_id
                             AND o.args @> jsonb_build_object('refund_id', r.id))
         ORDER BY r.created_at, r.id LIMIT max_rows)
    ) AS c (kind, id, principal_id, status, created_at)
    ORDER BY c.created_at, c.id LIMIT max_rows;
END
$$;

GRANT CREATE ON SCHEMA public TO payments_definer; -- for the handover (000009)
ALTER FUNCTION outbox_pending(int) OWNER TO payments_definer;
ALTER FUNCTION outbox_relayed(uuid[], uuid[]) OWNER TO payments_definer;
ALTER FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) OWNER TO payments_definer;
REVOKE CREATE ON SCHEMA public FROM payments_definer;
REVOKE ALL ON FUNCTION outbox_pending(int) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_relayed(uuid[], uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox_pending(int) TO payments_app;
GRANT EXECUTE ON FUNCTION outbox_relayed(uuid[], uuid[]) TO payments_app;
GRANT EXECUTE ON FUNCTION reconciliation_candidates(interval, timestamptz, uuid, int) TO payments_app;

COMMIT;
