-- Sessions for auditors and dashboards (DESIGN 10): every session with its age and idle time,
-- and the open ones. Like the other v_* views, read-only to sandgate_app and sandgate_auditor.
CREATE VIEW v_sessions AS
SELECT s.id,
       s.tenant,
       s.language,
       s.status,
       s.closed_reason,
       s.executions,
       s.created_at AS time,
       s.created_at,
       s.last_used_at,
       s.expires_at,
       s.closed_at,
       (extract(epoch FROM coalesce(s.closed_at, now()) - s.created_at))::bigint AS age_seconds,
       (extract(epoch FROM coalesce(s.closed_at, now()) - s.last_used_at))::bigint AS idle_seconds
FROM sessions AS s;

CREATE VIEW v_sessions_open AS
SELECT * FROM v_sessions WHERE status <> 'closed';

REVOKE ALL ON v_sessions, v_sessions_open FROM sandgate_app;
GRANT SELECT ON v_sessions, v_sessions_open TO sandgate_app, sandgate_auditor;
