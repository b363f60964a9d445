-- Views for auditors and dashboards (dashboards/*.json query these, never the tables). Each is
-- plain SQL over the audit tables; the base tables stay the record. sandgate_app and
-- sandgate_auditor may only read them (default privileges would also let sandgate_app write
-- through a simple view, so that is revoked explicitly).

-- Every audit event, one row per reason it gives (an event without reasons gives one row with
-- reason_code NULL): count(DISTINCT seq) counts decisions, count(*) counts reasons. outcome:
-- deny, review (allowed once a reviewer approves), allow, or none (events that decide nothing).
CREATE VIEW v_decisions AS
SELECT e.seq,
       e.at AS time,
       e.kind,
       CASE WHEN e.allow IS NULL THEN 'none'
            WHEN NOT e.allow THEN 'deny'
            WHEN e.decision ->> 'require_approval' = 'true' THEN 'review'
            ELSE 'allow' END AS outcome,
       r.reason ->> 'code' AS reason_code,
       e.tenant,
       e.execution_id,
       e.key_id,
       e.policy_revision
FROM audit_events AS e
LEFT JOIN LATERAL jsonb_array_elements(
    CASE WHEN jsonb_typeof(e.reasons) = 'array' THEN e.reasons ELSE '[]'::jsonb END
) AS r (reason) ON true;

-- Every egress attempt, allowed or denied.
CREATE VIEW v_egress AS
SELECT c.opened_at AS time,
       c.execution_id,
       c.tenant,
       c.host,
       c.port,
       c.scheme,
       c.allow,
       CASE WHEN c.allow THEN 'allow' ELSE 'deny' END AS outcome,
       c.reason,
       c.bytes_up,
       c.bytes_down,
       c.duration_ms,
       c.closed_at
FROM egress_connections AS c;

-- Denied egress per destination and reason, over all time.
CREATE VIEW v_denied_egress AS
SELECT c.host,
       c.port,
       c.reason,
       count(*) AS attempts,
       count(DISTINCT c.execution_id) AS executions,
       count(DISTINCT c.tenant) AS tenants,
       min(c.opened_at) AS first_at,
       max(c.opened_at) AS last_at
FROM egress_connections AS c
WHERE NOT c.allow
GROUP BY c.host, c.port, c.reason;

-- Executions without their output: who, where, how it ended, how long it took.
CREATE VIEW v_executions AS
SELECT x.id,
       x.tenant,
       x.key_id,
       x.language,
       coalesce(x.backend, '-') AS backend,
       x.status,
       x.allow,
       x.policy_revision,
       x.created_at AS time,
       x.created_at,
       x.started_at,
       x.finished_at,
       (extract(epoch FROM x.started_at - x.created_at) * 1000)::bigint AS queued_ms,
       x.duration_ms,
       x.exit_code
FROM executions AS x;

REVOKE ALL ON v_decisions, v_egress, v_denied_egress, v_executions FROM sandgate_app;
GRANT SELECT ON v_decisions, v_egress, v_denied_egress, v_executions
    TO sandgate_app, sandgate_auditor;
