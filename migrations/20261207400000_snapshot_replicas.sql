-- Snapshots on every replica (issue 24 item 7; docs/snapshots.md "Replicas"): a pause or a
-- kept snapshot of a session whose sandbox runs on another replica is relayed to it through
-- `session_turns`, like an execution; a relayed snapshot answers with the id it kept.
ALTER TABLE session_turns DROP CONSTRAINT session_turns_kind_check;
ALTER TABLE session_turns ADD CONSTRAINT session_turns_kind_check
    CHECK (kind IN ('execute', 'close', 'pause', 'resume', 'snapshot'));
ALTER TABLE session_turns ADD COLUMN snapshot_id text;
GRANT SELECT (snapshot_id) ON session_turns TO sandgate_auditor;
