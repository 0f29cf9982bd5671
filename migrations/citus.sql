-- Distributes the schema by principal on a Citus cluster (docs/scaling.md).
-- `api migrate up` runs it after the numbered migrations and River's, when
-- the database has the citus extension (database.Migrate), a statement at a
-- time (ALTER SYSTEM refuses a transaction block): so a cluster is migrated
-- and distributed by the same command, and a table a later migration adds
-- is distributed by the next `migrate up`. Every statement can run again:
-- what is distributed already is left as it is. Run it before the service
-- takes traffic: create_distributed_table moves a table's rows into shards
-- on the workers. TestPaymentsOnCitus runs it on a real cluster in CI;
-- TestEveryStatementRoutesToOnePartition checks, on plain PostgreSQL, that
-- every statement the service runs on these tables routes to one shard.
-- Statements end with a semicolon at the end of a line (outside $$ bodies).

-- Copied to every worker: a request authenticates, and the sweepers list
-- principals, on whichever node its statement runs.
SELECT create_reference_table('principals')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'principals'::regclass);
SELECT create_reference_table('api_keys')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'api_keys'::regclass);

-- The tenant tables, colocated: one principal's rows of every table are on
-- one worker, so that a request is a transaction on one node. Parents
-- before the tables whose foreign keys name them. A request's job (a
-- charge, a refund, a webhook delivery) is a row of outbox_jobs on its
-- payment's shard, committed with the payment in one single-shard
-- transaction.
SELECT create_distributed_table('payments', 'principal_id')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass);
SELECT create_distributed_table('refunds', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'refunds'::regclass);
SELECT create_distributed_table('events', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'events'::regclass);
SELECT create_distributed_table('webhook_endpoints', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'webhook_endpoints'::regclass);
SELECT create_distributed_table('webhook_deliveries', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'webhook_deliveries'::regclass);
SELECT create_distributed_table('webhook_endpoint_leases', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'webhook_endpoint_leases'::regclass);
SELECT create_distributed_table('idempotency_keys', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass);
SELECT create_distributed_table('idempotency_key_usage', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_key_usage'::regclass);
SELECT create_distributed_table('outbox_jobs', 'principal_id', colocate_with => 'payments')
WHERE NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'outbox_jobs'::regclass);

-- River's tables (river_job and the rest) stay on the coordinator. The
-- relay (internal/outbox, Relay) copies outbox_jobs into river_job with a
-- unique key per row, then deletes what it copied: a relay that dies
-- between the two copies nothing twice (docs/scaling.md, "The outbox on
-- the shard").

-- A listed row's xid must come from the node whose snapshot the list reads:
-- the lists show rows older than list_horizon(), which runs on the worker
-- with the rest of the list's statement. Citus evaluates the column's
-- default, pg_current_xact_id(), on the coordinator, so every list answered
-- an empty page (the coordinator's xids were ahead of the workers'). A
-- trigger runs on the shard, on the worker, in the worker's transaction.
-- Rows distributed from an earlier single server keep that server's xids:
-- distribute before the service takes traffic.
CREATE OR REPLACE FUNCTION set_worker_xid() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.xid := pg_current_xact_id();
    RETURN NEW;
END
$$;
-- A trigger on a distributed table is "unsafe" to Citus when it could
-- touch other shards; this one sets a column of its own row.
SET citus.enable_unsafe_triggers = on;
CREATE OR REPLACE TRIGGER payments_worker_xid BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION set_worker_xid();
CREATE OR REPLACE TRIGGER refunds_worker_xid BEFORE INSERT ON refunds FOR EACH ROW EXECUTE FUNCTION set_worker_xid();
CREATE OR REPLACE TRIGGER events_worker_xid BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION set_worker_xid();
CREATE OR REPLACE TRIGGER webhook_endpoints_worker_xid BEFORE INSERT ON webhook_endpoints FOR EACH ROW EXECUTE FUNCTION set_worker_xid();
CREATE OR REPLACE TRIGGER webhook_deliveries_worker_xid BEFORE INSERT ON webhook_deliveries FOR EACH ROW EXECUTE FUNCTION set_worker_xid();

-- The SECURITY DEFINER functions (authenticate_request, the quota's
-- add_idempotency_key_claims, the reconciler's candidates, the relay's
-- outbox_pending and outbox_relayed) run as payments_definer, and Citus
-- opens its connections to the workers as the role that runs the
-- statement: the function's owner. A role that cannot log in cannot reach
-- the shards ("role payments_definer is not permitted to log in": the
-- quota's flush failed on every run). On a cluster it must log in; it has
-- no password, so allow it in each worker's pg_hba.conf from the
-- coordinator's address only.
ALTER ROLE payments_definer LOGIN;

-- The relay's read and delete when a worker is down (docs/scaling.md, "The
-- outbox on the shard"). As migration 24 wrote them, each is one statement
-- over every shard, which Citus fails whole when one worker is down: every
-- tenant's charges waited for that worker. Here each first runs that one
-- statement (about 15 ms a pass here), and only when it fails to reach a
-- node (class 08, or Citus's XX000) falls back: the read asks each node for
-- its own shards' jobs (outbox_pending_here, on every node, through
-- run_command_on_all_nodes: about 190 ms a pass, new connections each
-- time), leaving out a node that does not answer; the delete goes
-- principal by principal, each on its shard. The tenants of the workers
-- that are up are charged. Replaced again by every migrate up, after the
-- numbered migrations, which keep the one-server versions.
CREATE OR REPLACE FUNCTION outbox_pending_here(max_rows int) RETURNS json
    LANGUAGE plpgsql STABLE
    SET search_path = public, pg_temp
AS $$
DECLARE
    shard regclass;
    reads text[] := '{}';
    pending json;
BEGIN
    FOR shard IN SELECT c.oid::regclass FROM pg_class c
                 WHERE c.relkind = 'r' AND c.relname ~ '^outbox_jobs_[0-9]+$' LOOP
        reads := reads || format('(SELECT principal_id, id, kind, queue, args, metadata, max_attempts, created_at FROM %s ORDER BY created_at, id LIMIT %s)', shard, max_rows);
    END LOOP;
    IF cardinality(reads) = 0 THEN
        RETURN '[]';
    END IF;
    EXECUTE format('SELECT coalesce(json_agg(j ORDER BY j.created_at, j.id), ''[]'') FROM (SELECT * FROM (%s) u ORDER BY created_at, id LIMIT %s) j',
                   array_to_string(reads, ' UNION ALL '), max_rows)
        INTO pending;
    RETURN pending;
END
$$;
SELECT create_distributed_function('outbox_pending_here(int)')
WHERE NOT EXISTS (SELECT FROM pg_dist_object WHERE objid = 'outbox_pending_here(int)'::regprocedure);
CREATE OR REPLACE FUNCTION outbox_pending(max_rows int)
    RETURNS TABLE (principal_id uuid, id uuid, kind text, queue text, args jsonb, metadata jsonb,
                   max_attempts smallint, created_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
BEGIN
    BEGIN
        RETURN QUERY
        SELECT o.principal_id, o.id, o.kind, o.queue, o.args, o.metadata, o.max_attempts, o.created_at
        FROM outbox_jobs o ORDER BY o.created_at, o.id LIMIT max_rows;
        RETURN;
    EXCEPTION WHEN connection_exception OR internal_error THEN
        NULL; -- a node is down: read the others, below
    END;
    RETURN QUERY
    SELECT j.principal_id, j.id, j.kind, j.queue, j.args, j.metadata, j.max_attempts, j.created_at
    FROM run_command_on_all_nodes(format('SELECT outbox_pending_here(%s)', max_rows)) r
    CROSS JOIN LATERAL json_to_recordset(CASE WHEN r.success THEN r.result::json ELSE '[]' END)
        AS j (principal_id uuid, id uuid, kind text, queue text, args jsonb, metadata jsonb,
              max_attempts smallint, created_at timestamptz)
    ORDER BY j.created_at, j.id LIMIT max_rows;
END
$$;
CREATE OR REPLACE FUNCTION outbox_relayed(principals uuid[], ids uuid[])
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = public, pg_temp
AS $$
DECLARE
    p uuid;
    deleted bigint;
    n bigint := 0;
BEGIN
    BEGIN
        DELETE FROM outbox_jobs WHERE principal_id = ANY (principals) AND id = ANY (ids);
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN n;
    EXCEPTION WHEN connection_exception OR internal_error THEN
        NULL; -- a node is down: delete on the shards of the others, below
    END;
    FOR p IN SELECT DISTINCT u FROM unnest(principals) u LOOP
        DELETE FROM outbox_jobs WHERE principal_id = p AND id = ANY (ids);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        n := n + deleted;
    END LOOP;
    RETURN n;
END
$$;

-- The tenant a request's SET LOCAL names must reach the worker that runs
-- its statements, where row-level security reads it.
ALTER SYSTEM SET citus.propagate_set_commands = 'local';
SELECT pg_reload_conf();
