-- Views over approvals. The approvals table is created by 20261130000007_approvals.sql; it is
-- created here only where that migration is absent, with the columns these views need.
CREATE TABLE IF NOT EXISTS approvals (
    id               text PRIMARY KEY,
    execution_id     text,
    status           text,          -- pending, approved, rejected, expired
    created_at       timestamptz,
    expires_at       timestamptz,
    decided_at       timestamptz,
    reviewer_key_id  text,
    comment          text
);

-- Approvals nobody has decided yet, with their age and time left, oldest first in dashboards.
CREATE VIEW v_approvals_waiting AS
SELECT a.id,
       a.execution_id,
       x.tenant,
       x.language,
       a.created_at AS time,
       a.created_at,
       a.expires_at,
       (extract(epoch FROM now() - a.created_at))::bigint AS age_seconds,
       (extract(epoch FROM a.expires_at - now()))::bigint AS expires_in_seconds
FROM approvals AS a
LEFT JOIN executions AS x ON x.id = a.execution_id
WHERE a.status = 'pending';

-- Every approval with how long it waited for its decision.
CREATE VIEW v_approvals AS
SELECT a.id,
       a.execution_id,
       x.tenant,
       a.status,
       a.created_at AS time,
       a.created_at,
       a.decided_at,
       a.expires_at,
       a.reviewer_key_id,
       (extract(epoch FROM coalesce(a.decided_at, now()) - a.created_at))::bigint AS wait_seconds
FROM approvals AS a
LEFT JOIN executions AS x ON x.id = a.execution_id;

REVOKE ALL ON v_approvals_waiting, v_approvals FROM sandgate_app;
GRANT SELECT ON v_approvals_waiting, v_approvals TO sandgate_app, sandgate_auditor;
