-- Distributes the schema by principal on a Citus cluster (the `citus`
-- profile of docker-compose.yml; docs/scaling.md). Run once on the
-- coordinator, as the owner, after `api migrate up` and before the service
-- starts: create_distributed_table moves a table's rows into shards on the
-- workers. Untested in this repository's CI, which has no Docker engine;
-- TestEveryStatementRoutesToOnePartition checks, on plain PostgreSQL, that
-- every statement the service runs on these tables routes to one shard.

-- Copied to every worker: a request authenticates, and the sweepers list
-- principals, on whichever node its statement runs.
SELECT create_reference_table('principals');
SELECT create_reference_table('api_keys');

-- The tenant tables, colocated: one principal's rows of every table are on
-- one worker, so that a request is a transaction on one node. Parents
-- before the tables whose foreign keys name them.
SELECT create_distributed_table('payments', 'principal_id');
SELECT create_distributed_table('refunds', 'principal_id', colocate_with => 'payments');
SELECT create_distributed_table('events', 'principal_id', colocate_with => 'payments');
SELECT create_distributed_table('webhook_endpoints', 'principal_id', colocate_with => 'payments');
SELECT create_distributed_table('webhook_deliveries', 'principal_id', colocate_with => 'payments');
SELECT create_distributed_table('idempotency_keys', 'principal_id', colocate_with => 'payments');
SELECT create_distributed_table('idempotency_key_usage', 'principal_id', colocate_with => 'payments');

-- River's tables (river_job and the rest) stay on the coordinator. A
-- transaction that writes a payment on a worker and its charge job here is
-- not atomic across the two: docs/scaling.md, "The outbox, sharded", is
-- the design that fixes it, and it is not built. Until it is, this cluster
-- is for trying the routing, not for money.

-- The tenant a request's SET LOCAL names must reach the worker that runs
-- its statements, where row-level security reads it.
ALTER SYSTEM SET citus.propagate_set_commands = 'local';
SELECT pg_reload_conf();
