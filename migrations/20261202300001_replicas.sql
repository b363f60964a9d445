-- Replicas (DESIGN.md section 13): several gateways on one database. Each names itself in
-- `replicas` (heartbeat, the policy revision it runs), holds a lease on every record it runs,
-- and keeps the output files of what it ran in the database, so every replica can serve them.

CREATE TABLE replicas (
    instance         text PRIMARY KEY,
    started_at       timestamptz NOT NULL,
    heartbeat_at     timestamptz NOT NULL,
    policy_revision  text NOT NULL,
    -- Why this replica does not run the revision another one announced (NULL: it does).
    policy_error     text
);

-- A running record's lease: its instance renews it while it lives; once it is past, another
-- replica closes the record as `error`. NULL: created_at plus the configured lease.
ALTER TABLE executions ADD COLUMN lease_until timestamptz;
ALTER TABLE sessions ADD COLUMN lease_until timestamptz;
CREATE INDEX executions_open_leases ON executions (lease_until)
    WHERE finished_at IS NULL AND status IN ('queued', 'running');

-- A session whose replica died is closed by another one.
ALTER TABLE sessions DROP CONSTRAINT sessions_closed_reason_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_closed_reason_check CHECK (closed_reason IN
    ('deleted', 'idle', 'ttl', 'oom', 'crashed', 'gateway_restart', 'lease_expired'));

CREATE TABLE execution_outputs (
    execution_id  text NOT NULL REFERENCES executions (id),
    path          text NOT NULL,
    content       bytea NOT NULL,
    PRIMARY KEY (execution_id, path)
);

GRANT SELECT, INSERT, UPDATE ON replicas TO sandgate_app;
GRANT SELECT, INSERT, DELETE ON execution_outputs TO sandgate_app;
GRANT SELECT ON replicas TO sandgate_auditor;
