-- sandgate audit schema. Forward-only: never edit a migration that has shipped.
-- Every table is meant to be read by auditors with plain SQL.

-- API keys: only the SHA-256 of the key is stored; the key itself is shown once.
CREATE TABLE api_keys (
    id          text PRIMARY KEY,                     -- "key_<hex>", also embedded in the key
    key_hash    text NOT NULL UNIQUE,                 -- hex sha256 of the whole key
    role        text NOT NULL CHECK (role IN ('agent', 'reviewer', 'auditor', 'admin')),
    tenant      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- Each policy bundle revision that made decisions, stored once.
CREATE TABLE policy_revisions (
    revision    text PRIMARY KEY,                     -- "sha256:<hex>" of the bundle files
    files       jsonb NOT NULL,                       -- relative paths in the bundle
    loaded_by   text NOT NULL,                        -- "startup", or the admin key id
    loaded_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per execution request, allowed or not. Written with its decision before anything runs,
-- completed when the sandbox has gone.
CREATE TABLE executions (
    id               text PRIMARY KEY,                -- "ex_<uuid>"
    tenant           text NOT NULL,
    key_id           text NOT NULL,
    language         text NOT NULL,
    code_sha256      text NOT NULL,
    code_bytes       bigint NOT NULL,
    labels           jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL CHECK (status IN ('succeeded', 'failed', 'timeout', 'oom',
                         'killed', 'cancelled', 'denied', 'pending_approval', 'queued',
                         'running', 'error')),
    decision_id      text NOT NULL,
    allow            boolean NOT NULL,
    reasons          jsonb NOT NULL DEFAULT '[]',
    backend          text,
    runtime          text,
    image            text,
    limits           jsonb,
    policy_revision  text NOT NULL REFERENCES policy_revisions (revision),
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    exit_code        integer,
    duration_ms      bigint,
    stdout           text,
    stderr           text,
    stdout_truncated boolean NOT NULL DEFAULT false,
    stderr_truncated boolean NOT NULL DEFAULT false,
    outputs          jsonb NOT NULL DEFAULT '[]',
    error            text                             -- what went wrong, for status 'error'
);
CREATE INDEX executions_tenant_created ON executions (tenant, created_at DESC);
CREATE INDEX executions_status ON executions (status) WHERE finished_at IS NULL;

-- Append-only, hash-chained record of every decision of any kind:
-- hash = sha256(prev_hash || canonical JSON of the row), inserted under an advisory lock so the
-- chain stays linear. prev_hash of the first event is 64 zeros.
CREATE TABLE audit_events (
    seq              bigint PRIMARY KEY,              -- position in the chain, gapless
    id               text NOT NULL UNIQUE,            -- "ev_<uuid>"
    at               timestamptz NOT NULL,
    kind             text NOT NULL,                   -- execution.decision, auth.failure, ...
    execution_id     text,
    key_id           text,
    tenant           text,
    decision_id      text,
    allow            boolean,
    reasons          jsonb NOT NULL DEFAULT '[]',
    input            jsonb NOT NULL,                  -- what was decided on (no secrets)
    decision         jsonb NOT NULL,                  -- the decision as made
    policy_revision  text,
    prev_hash        text NOT NULL,
    hash             text NOT NULL UNIQUE
);
CREATE INDEX audit_events_execution ON audit_events (execution_id);
CREATE INDEX audit_events_kind_at ON audit_events (kind, at);

CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP;
END;
$$;
CREATE TRIGGER audit_events_no_update BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();
