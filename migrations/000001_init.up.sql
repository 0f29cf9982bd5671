BEGIN;

-- Roles. The service never connects as the owner of these tables: owners and
-- superusers bypass row-level security, so a test run as the owner would prove
-- nothing. Roles are cluster-wide, so several databases (and several test
-- databases created in parallel) may race to create them; the exception
-- handler makes that harmless.
DO $$
BEGIN
    CREATE ROLE payments_app LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;
DO $$
BEGIN
    CREATE ROLE payments_maintenance LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;

-- A principal is a tenant: the unit that owns payments and idempotency keys.
CREATE TABLE principals (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as sha256 of the secret. The secret has 256 bits of
-- entropy, so an unsalted fast hash is enough: there is nothing to brute-force.
CREATE TABLE api_keys (
    id          uuid        PRIMARY KEY,
    principal_id uuid       NOT NULL REFERENCES principals (id),
    secret_hash bytea       NOT NULL UNIQUE CHECK (length(secret_hash) = 32),
    scopes      text[]      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- payments.principal_id and idempotency_keys.principal_id deliberately have no
-- foreign key to principals: every insert would take a FOR KEY SHARE lock on
-- the principal's row, and concurrent inserts for one busy tenant would then
-- pile up MultiXacts on that single row. principal_id always comes from an
-- authenticated API key, and principals are never deleted.
CREATE TABLE payments (
    id           uuid        PRIMARY KEY,
    principal_id uuid        NOT NULL,
    amount       bigint      NOT NULL CHECK (amount > 0),
    currency     text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    status       text        NOT NULL CHECK (status IN ('succeeded')),
    description  text        CHECK (length(description) <= 1000),
    metadata     jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL
);

-- One row per (principal, endpoint, key): the primary key IS the concurrency
-- control. A second INSERT of the same scope blocks on this index until the
-- first transaction ends, then sees its row (or inserts, if it rolled back).
CREATE TABLE idempotency_keys (
    principal_id          uuid        NOT NULL,
    endpoint              text        NOT NULL,
    key                   text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    state                 text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed')),
    fingerprint           bytea       NOT NULL CHECK (length(fingerprint) = 32),
    response_status       smallint,
    response_content_type text,
    response_body         bytea,
    correlation_id        text        NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    expires_at            timestamptz NOT NULL,
    PRIMARY KEY (principal_id, endpoint, key),
    -- A finished row always has a response to replay; an unfinished one never does.
    CONSTRAINT idempotency_keys_response_matches_state
        CHECK ((state = 'in_progress') = (response_status IS NULL))
);

-- The sweeper walks this index oldest-first in bounded chunks.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- Finds stuck claims without scanning the table. In this service a claim
-- commits together with its outcome, so no committed row is in_progress; the
-- index matters once an endpoint commits a claim before its work. Every claim
-- still adds an entry (dead once the outcome is stored, until vacuum), and the
-- state change makes the outcome's UPDATE non-HOT: see docs/performance.md.
CREATE INDEX idempotency_keys_in_progress_idx ON idempotency_keys (created_at)
    WHERE state = 'in_progress';

-- Tenant isolation enforced by PostgreSQL, not only by WHERE clauses in Go.
-- The service sets app.principal_id per transaction with set_config(..., true).
-- NULLIF matters: once a session has set the variable, it reads back as ''
-- (not NULL) after the transaction ends, and ''::uuid would raise an error
-- instead of matching nothing.
ALTER TABLE payments ENABLE ROW LEVEL SECURITY;
ALTER TABLE payments FORCE ROW LEVEL SECURITY;
CREATE POLICY payments_tenant ON payments
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);

ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY idempotency_keys_tenant ON idempotency_keys
    TO payments_app
    USING (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid)
    WITH CHECK (principal_id = NULLIF(current_setting('app.principal_id', true), '')::uuid);

-- The maintenance role (sweeper, store-health gauges) sees every tenant's rows
-- but, through column privileges, none of their fingerprints or responses, and
-- PostgreSQL itself refuses to let it delete a row before its expires_at.
CREATE POLICY idempotency_keys_maintenance_read ON idempotency_keys
    FOR SELECT TO payments_maintenance
    USING (true);
CREATE POLICY idempotency_keys_maintenance_expire ON idempotency_keys
    FOR DELETE TO payments_maintenance
    USING (expires_at < now());

GRANT SELECT ON principals, api_keys TO payments_app;
GRANT SELECT, INSERT, UPDATE ON payments, idempotency_keys TO payments_app;
GRANT SELECT (principal_id, endpoint, key, state, created_at, expires_at), DELETE
    ON idempotency_keys TO payments_maintenance;

COMMIT;
