-- A paused session's checkpoint, stored with it (DESIGN 15, issue 24 item 3): a gateway that
-- stops gracefully pauses its idle sessions, and the restarted gateway (same instance) serves
-- them from these rows; a row exists only once its image is complete and its sha256 taken, and
-- goes with the resume or the close. `runnable` is the floor the session was admitted with
-- (limits, mounts, network grant: never a credential value).
CREATE TABLE session_pauses (
    session_id        text PRIMARY KEY REFERENCES sessions (id),
    image             text NOT NULL,
    sha256            text NOT NULL,
    bytes             bigint NOT NULL,
    runnable          jsonb NOT NULL,
    language          text NOT NULL,
    executions        bigint NOT NULL,
    -- Its grant inspected a destination: the restored program trusts a CA whose key lived only
    -- in the pausing process, so another process cannot serve it (the session is closed).
    inspected         boolean NOT NULL,
    closes_when_idle  boolean NOT NULL DEFAULT false,
    paused_at         timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT, UPDATE, DELETE ON session_pauses TO sandgate_app;
GRANT SELECT (session_id, sha256, bytes, language, executions, inspected, paused_at)
    ON session_pauses TO sandgate_auditor;

-- A kept snapshot of a session whose grant inspected a destination: a fork needs the CA the
-- image trusts, which only the process that took it holds.
ALTER TABLE snapshots ADD COLUMN inspected boolean NOT NULL DEFAULT false;
