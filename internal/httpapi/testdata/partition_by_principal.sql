-- Turns every tenant table of a migrated database into a table
-- hash-partitioned by principal_id, keeping its columns, defaults, checks,
-- indexes, primary key, foreign keys, row-level security, policies, owner
-- and grants: what a distributed PostgreSQL (Citus) does to them with
-- create_distributed_table, on one server. A statement that the planner can
-- confine to one partition would go to one shard (TestEveryStatementRoutesToOnePartition).
-- For an empty database only: the rows are not copied.
DO $$
DECLARE
    -- Every table with a principal_id but api_keys (a reference table on
    -- Citus), as TestEveryStatementRoutesToOnePartition lists them.
    tenant_tables text[] := (
        SELECT array_agg(c.relname::text ORDER BY c.relname)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE a.attname = 'principal_id' AND c.relnamespace = 'public'::regnamespace
          AND c.relkind = 'r' AND c.relname <> 'api_keys');
    partitions int := 8;
    t text;
    old text;
    i int;
    r record;
    fks text[] := '{}';
    fk text;
BEGIN
    FOR r IN
        SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def
        FROM pg_constraint
        WHERE contype = 'f' AND (conrelid::regclass::text = ANY (tenant_tables) OR confrelid::regclass::text = ANY (tenant_tables))
    LOOP
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', r.tbl, r.conname);
        fks := fks || format('ALTER TABLE %I ADD CONSTRAINT %I %s', r.tbl, r.conname, r.def);
    END LOOP;

    FOREACH t IN ARRAY tenant_tables LOOP
        old := t || '_unpartitioned';
        EXECUTE format('ALTER TABLE %I RENAME TO %I', t, old);
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING ALL) PARTITION BY HASH (principal_id)', t, old);
        FOR i IN 0 .. partitions - 1 LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES WITH (MODULUS %s, REMAINDER %s)', t || '_p' || i, t, partitions, i);
        END LOOP;
        SELECT c.relowner::regrole::text AS owner, c.relrowsecurity AS rls, c.relforcerowsecurity AS force
            INTO r FROM pg_class c WHERE c.oid = old::regclass;
        EXECUTE format('ALTER TABLE %I OWNER TO %s', t, r.owner);
        IF r.rls THEN
            EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        END IF;
        IF r.force THEN
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        END IF;
        FOR r IN SELECT * FROM pg_policies WHERE schemaname = 'public' AND tablename = old LOOP
            EXECUTE format('CREATE POLICY %I ON %I AS %s FOR %s TO %s %s %s', r.policyname, t, r.permissive, r.cmd,
                (SELECT string_agg(quote_ident(role), ', ') FROM unnest(r.roles) role),
                CASE WHEN r.qual IS NOT NULL THEN 'USING (' || r.qual || ')' ELSE '' END,
                CASE WHEN r.with_check IS NOT NULL THEN 'WITH CHECK (' || r.with_check || ')' ELSE '' END);
        END LOOP;
        FOR r IN
            SELECT a.grantee::regrole::text AS grantee, a.privilege_type
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.oid = old::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
        LOOP
            EXECUTE format('GRANT %s ON %I TO %s', r.privilege_type, t, r.grantee);
        END LOOP;
        FOR r IN
            SELECT att.attname, a.grantee::regrole::text AS grantee, a.privilege_type
            FROM pg_attribute att, aclexplode(att.attacl) a
            WHERE att.attrelid = old::regclass AND att.attacl IS NOT NULL AND a.grantee <> 0
        LOOP
            EXECUTE format('GRANT %s (%I) ON %I TO %s', r.privilege_type, r.attname, t, r.grantee);
        END LOOP;
        EXECUTE format('DROP TABLE %I', old);
    END LOOP;

    FOREACH fk IN ARRAY fks LOOP
        EXECUTE fk;
    END LOOP;
END
$$;
