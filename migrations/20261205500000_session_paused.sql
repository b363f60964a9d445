-- Snapshots (DESIGN 15): a session can be `paused`, its sandbox checkpointed to disk and its
-- container gone; the next execution or `POST /v1/sessions/{id}/resume` restores it.
ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_status_check
    CHECK (status IN ('pending_approval', 'ready', 'busy', 'paused', 'closed'));

-- An execution sent to a paused session restores it first; its record says so.
ALTER TABLE executions ADD COLUMN resumed boolean NOT NULL DEFAULT false;
