-- Sessions on every replica (DESIGN.md section 13): a replica that does not hold a session's
-- sandbox relays a request to the one that does through a row here (and a NOTIFY). The owner
-- claims the row (`picked_at`), decides, records and runs the turn as if it had been asked
-- itself, and writes the answer back (`execution_id`, or an error). An asker that gives up
-- before the owner picked the row marks it `abandoned_at`; exactly one of the two wins.
-- Rows are removed once answered and read (or after an hour by the owner's sweep).
CREATE TABLE session_turns (
    id            text PRIMARY KEY,
    session_id    text NOT NULL REFERENCES sessions (id),
    -- The replica holding the session's sandbox, and the one that was asked.
    owner         text NOT NULL,
    asked_by      text NOT NULL,
    -- The caller, checked again by the owner (a key revoked meanwhile runs nothing).
    key_id        text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('execute', 'close')),
    request       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    picked_at     timestamptz,
    abandoned_at  timestamptz,
    answered_at   timestamptz,
    execution_id  text,
    error_code    text CHECK (error_code IN
        ('invalid', 'not_found', 'forbidden', 'conflict', 'rate_limited', 'unavailable', 'internal')),
    error         text,
    CHECK (picked_at IS NULL OR abandoned_at IS NULL)
);
CREATE INDEX session_turns_waiting ON session_turns (owner)
    WHERE picked_at IS NULL AND abandoned_at IS NULL;
GRANT SELECT, INSERT, UPDATE, DELETE ON session_turns TO sandgate_app;

-- Purged records of one replica, in purge order: each replica removes the collected files of
-- its executions that another replica purged.
CREATE INDEX executions_purged ON executions (instance, purged_at, id) WHERE purged_at IS NOT NULL;
