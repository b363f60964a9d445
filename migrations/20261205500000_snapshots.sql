-- Snapshots (DESIGN 15): a session can be `paused`, its sandbox checkpointed to disk and its
-- container gone; the next execution or `POST /v1/sessions/{id}/resume` restores it.
ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_status_check
    CHECK (status IN ('pending_approval', 'ready', 'busy', 'paused', 'closed'));

-- An execution sent to a paused session restores it first; its record says so.
ALTER TABLE executions ADD COLUMN resumed boolean NOT NULL DEFAULT false;

-- A snapshot: a checkpoint image of a session kept under the snapshots directory (0600 files
-- under 0700 directories), its sha256 (also in the chain: `snapshot.created`) checked before
-- every restore. `POST /v1/sessions {"from_snapshot"}` forks a new session from it.
CREATE TABLE snapshots (
    id          text PRIMARY KEY,
    tenant      text NOT NULL,
    key_id      text NOT NULL,
    session_id  text NOT NULL REFERENCES sessions (id),
    language    text NOT NULL,
    -- The mounts the image was taken with: a restore needs the same ones.
    mounts      jsonb NOT NULL DEFAULT '[]',
    path        text NOT NULL,
    bytes       bigint NOT NULL,
    sha256      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    deleted_at  timestamptz
);
CREATE INDEX snapshots_tenant ON snapshots (tenant, created_at DESC) WHERE deleted_at IS NULL;
CREATE INDEX snapshots_expiry ON snapshots (expires_at) WHERE deleted_at IS NULL;
REVOKE DELETE, TRUNCATE ON snapshots FROM sandgate_app;
GRANT SELECT, INSERT, UPDATE ON snapshots TO sandgate_app;
GRANT SELECT (id, tenant, key_id, session_id, language, bytes, sha256, created_at, expires_at,
              deleted_at) ON snapshots TO sandgate_auditor;
