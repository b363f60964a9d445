-- E2B-compatible API (DESIGN section 14): what an E2B sandbox adds to its sandgate session.
-- The session row (its decision, status, lifetime) stays the one record of the sandbox; this
-- row keeps the E2B facts: the template, the metadata the SDK filters on, and the hashes
-- (sha256, hex) of the envd access tokens issued for it (one per create or connect answer).
-- A token is never stored in clear, and only ever valid for this one sandbox.
CREATE TABLE e2b_sandboxes (
    session_id text PRIMARY KEY REFERENCES sessions (id),
    tenant text NOT NULL,
    key_id text NOT NULL,
    template text NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    allow_internet_access boolean,
    token_hashes text[] NOT NULL DEFAULT '{}',
    end_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX e2b_sandboxes_tenant ON e2b_sandboxes (tenant, created_at DESC);

-- Rows are kept (the sandbox's record); the auditor reads every column but the token hashes,
-- as with api_keys (20261204200001).
REVOKE DELETE, TRUNCATE ON e2b_sandboxes FROM sandgate_app;
GRANT SELECT, INSERT, UPDATE ON e2b_sandboxes TO sandgate_app;
REVOKE SELECT ON e2b_sandboxes FROM sandgate_auditor;
GRANT SELECT (session_id, tenant, key_id, template, metadata, allow_internet_access, end_at, created_at)
    ON e2b_sandboxes TO sandgate_auditor;
