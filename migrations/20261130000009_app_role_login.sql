-- Least privilege, one step further.
--
-- sandgate_app may log in by itself (no password: only where the server trusts the connection,
-- as the embedded cluster's Unix socket does). The gateway then connects as sandgate_app, not as
-- the owner with a default role, so no statement on its connections can `SET ROLE NONE` back to
-- the owner. Where it cannot (an external server that wants a password), the gateway falls back
-- to the owner's login with `role=sandgate_app` and says so in its log.
-- Roles belong to the cluster: several databases may migrate at once, so only one needs to
-- succeed ("tuple concurrently updated" is another one doing it at the same moment).
DO $$
BEGIN
    IF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'sandgate_app') THEN
        ALTER ROLE sandgate_app LOGIN;
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'sandgate_app stays NOLOGIN: % may not alter it', current_user;
    WHEN internal_error THEN
        NULL;
END
$$;

-- The gateway never updates these: inserting a revision is ON CONFLICT DO NOTHING, and keys are
-- only inserted (and read).
REVOKE UPDATE ON api_keys, policy_revisions FROM sandgate_app;

-- Auditors read approvals without the stored payload (the code and files of a pending request).
REVOKE SELECT ON approvals FROM sandgate_auditor;
GRANT SELECT (id, execution_id, status, created_at, expires_at, decided_at, reviewer_key_id,
              comment, tenant, requester_key_id, requester_principal, reviewer_principal,
              runnable, reasons, summary)
    ON approvals TO sandgate_auditor;
