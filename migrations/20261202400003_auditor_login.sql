-- sandgate_auditor may log in by itself, so `sandgate audit psql` and auditors' tools act as
-- the read-only role itself, not as the owner with a default role (from which `SET ROLE` could
-- lead back to the owner). Without a password it gets in only where the server trusts the
-- connection, as the embedded cluster's Unix socket does (0700: root and the cluster's user);
-- over TCP (`audit_listen`) the gateway sets its password from the configured file.
DO $$
BEGIN
    IF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'sandgate_auditor') THEN
        ALTER ROLE sandgate_auditor LOGIN;
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'sandgate_auditor stays NOLOGIN: % may not alter it', current_user;
    WHEN internal_error THEN
        NULL;
END
$$;
