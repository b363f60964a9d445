-- Sessions may reach the network (DESIGN 10): their grant is decided when the session opens and
-- served on the session's socket for its whole life, so a connection belongs to the session and
-- to the execution running at that moment, if any (a background thread between executions has
-- none). Every row names at least one of the two.
ALTER TABLE egress_connections ADD COLUMN session_id text REFERENCES sessions (id);
ALTER TABLE egress_connections ALTER COLUMN execution_id DROP NOT NULL;
ALTER TABLE egress_connections ADD CONSTRAINT egress_connections_owner
    CHECK (execution_id IS NOT NULL OR session_id IS NOT NULL);
CREATE INDEX egress_connections_session ON egress_connections (session_id, opened_at)
    WHERE session_id IS NOT NULL;

ALTER TABLE egress_requests ADD COLUMN session_id text REFERENCES sessions (id);
ALTER TABLE egress_requests ALTER COLUMN execution_id DROP NOT NULL;
ALTER TABLE egress_requests ADD CONSTRAINT egress_requests_owner
    CHECK (execution_id IS NOT NULL OR session_id IS NOT NULL);
