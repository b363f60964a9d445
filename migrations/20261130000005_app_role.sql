-- The roles the gateway and auditors act as. Migrations run as the connecting user, who owns the
-- tables; every connection of the gateway's pool then acts as sandgate_app (the `role` start-up
-- parameter), which may read and append to audit_events but never UPDATE, DELETE or TRUNCATE it.
-- The triggers of the first migration stay: they also stop the owner.
--
-- Roles belong to the whole cluster, tables to one database: the roles are created once (if
-- missing; several databases of one cluster may migrate at the same time), the grants are made
-- in every database.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['sandgate_app', 'sandgate_auditor'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role_name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created by a concurrent migration of another database
            END;
        END IF;
    END LOOP;
    -- The migrating user must be able to act as sandgate_app (a superuser always can).
    IF NOT pg_has_role(current_user, 'sandgate_app', 'MEMBER') THEN
        EXECUTE format('GRANT sandgate_app TO %I', current_user);
    END IF;
END
$$;

-- sandgate_app: what the gateway does, nothing more.
REVOKE ALL ON api_keys, policy_revisions, executions, audit_events, egress_connections
    FROM sandgate_app;
GRANT SELECT, INSERT, UPDATE ON api_keys, policy_revisions, executions, egress_connections
    TO sandgate_app;
GRANT SELECT, INSERT ON audit_events TO sandgate_app;

-- sandgate_auditor: reads everything, changes nothing (grant it to a login role for Grafana or
-- an auditor: GRANT sandgate_auditor TO alice).
GRANT SELECT ON api_keys, policy_revisions, executions, audit_events, egress_connections
    TO sandgate_auditor;

-- Tables later migrations create (as this same user) get the same treatment by default; a later
-- migration that must keep sandgate_app from changing a table revokes it there.
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE ON TABLES TO sandgate_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO sandgate_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT ON TABLES TO sandgate_auditor;
