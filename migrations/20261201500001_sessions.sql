-- Sessions (DESIGN.md section 10): one sandbox kept alive across an agent's executions.
CREATE TABLE sessions (
    id              text PRIMARY KEY,
    tenant          text NOT NULL,
    key_id          text NOT NULL,
    language        text NOT NULL,
    status          text NOT NULL CHECK (status IN ('ready', 'busy', 'closed')),
    closed_reason   text CHECK (closed_reason IN ('deleted', 'idle', 'ttl', 'oom', 'crashed', 'gateway_restart')),
    decision        jsonb NOT NULL,
    limits          jsonb NOT NULL,
    idle_timeout_s  bigint NOT NULL,
    ttl_s           bigint NOT NULL,
    executions      bigint NOT NULL DEFAULT 0,
    instance        text NOT NULL,
    container       text,
    created_at      timestamptz NOT NULL,
    last_used_at    timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    closed_at       timestamptz,
    CHECK ((status = 'closed') = (closed_reason IS NOT NULL))
);
CREATE INDEX sessions_tenant_open ON sessions (tenant) WHERE status <> 'closed';

-- An execution run in a session, and its final expression's repr (python).
ALTER TABLE executions ADD COLUMN session_id text REFERENCES sessions (id);
ALTER TABLE executions ADD COLUMN result text;
