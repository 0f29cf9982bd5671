-- River's tables (created by rivermigrate, at the version the river module in
-- go.mod ships) hold the outbox: jobs inserted in a request's transaction and
-- worked by the service. They are not per tenant, so they are outside
-- row-level security; the service role may work jobs and nothing more.
-- Applied after River's migrations on every `migrate up`; GRANT is idempotent.
GRANT SELECT, INSERT, UPDATE, DELETE ON river_job, river_leader, river_queue, river_notification TO payments_app;
GRANT SELECT ON river_migration TO payments_app;
GRANT USAGE, SELECT ON SEQUENCE river_job_id_seq, river_notification_id_seq TO payments_app;
-- The store-health gauges read the outbox's lag.
GRANT SELECT ON river_job TO payments_maintenance;
-- reconciliation_candidates of migrations 10 to 22 (owned by
-- payments_definer) looked for the live job of an undecided payment or
-- refund; migration 23's asks the reconciler to (outbox.Live), and its down
-- migration brings the old one back.
GRANT SELECT ON river_job TO payments_definer;
