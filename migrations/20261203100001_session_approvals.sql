-- A session held for review (DESIGN 10: `POST /v1/sessions` answers 202 `pending_approval`):
-- approvals get a second subject. An approval is bound to exactly one execution or exactly one
-- session; a session's approval is named on the session too (`sessions.approval_id`).
--
-- A pending session belongs to no replica: `instance` is '' and `lease_until` is 'infinity'
-- (nothing of it runs anywhere, so no lease can lapse and no restart closes it). Approving it
-- hands it to the deciding replica (its instance, a real lease), which starts its sandbox.
ALTER TABLE approvals ALTER COLUMN execution_id DROP NOT NULL;
ALTER TABLE approvals ADD COLUMN session_id text REFERENCES sessions (id);
ALTER TABLE approvals ADD CONSTRAINT approvals_one_subject
    CHECK (num_nonnulls(execution_id, session_id) = 1);
CREATE INDEX approvals_session ON approvals (session_id) WHERE session_id IS NOT NULL;

ALTER TABLE sessions ADD COLUMN approval_id text;

ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_status_check
    CHECK (status IN ('pending_approval', 'ready', 'busy', 'closed'));
-- `denied`: a reviewer rejected it; `expired`: nobody decided in time; `start_failed`: approved,
-- but its sandbox could not be started.
ALTER TABLE sessions DROP CONSTRAINT sessions_closed_reason_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_closed_reason_check CHECK (closed_reason IN
    ('deleted', 'idle', 'ttl', 'oom', 'crashed', 'gateway_restart', 'lease_expired', 'denied',
     'expired', 'start_failed'));

-- The approval views (20261130000008) over both subjects: the tenant and language come from
-- the execution or the session.
DROP VIEW v_approvals_waiting;
DROP VIEW v_approvals;

CREATE VIEW v_approvals_waiting AS
SELECT a.id,
       a.execution_id,
       coalesce(x.tenant, s.tenant) AS tenant,
       coalesce(x.language, s.language) AS language,
       a.created_at AS time,
       a.created_at,
       a.expires_at,
       (extract(epoch FROM now() - a.created_at))::bigint AS age_seconds,
       (extract(epoch FROM a.expires_at - now()))::bigint AS expires_in_seconds,
       a.session_id
FROM approvals AS a
LEFT JOIN executions AS x ON x.id = a.execution_id
LEFT JOIN sessions AS s ON s.id = a.session_id
WHERE a.status = 'pending';

CREATE VIEW v_approvals AS
SELECT a.id,
       a.execution_id,
       coalesce(x.tenant, s.tenant) AS tenant,
       a.status,
       a.created_at AS time,
       a.created_at,
       a.decided_at,
       a.expires_at,
       a.reviewer_key_id,
       (extract(epoch FROM coalesce(a.decided_at, now()) - a.created_at))::bigint AS wait_seconds,
       a.session_id
FROM approvals AS a
LEFT JOIN executions AS x ON x.id = a.execution_id
LEFT JOIN sessions AS s ON s.id = a.session_id;

REVOKE ALL ON v_approvals_waiting, v_approvals FROM sandgate_app;
GRANT SELECT ON v_approvals_waiting, v_approvals TO sandgate_app, sandgate_auditor;

-- Auditors read the new subject column like the others (never the stored payload).
GRANT SELECT (session_id) ON approvals TO sandgate_auditor;
