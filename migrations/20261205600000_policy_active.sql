-- The policy revision last activated on any replica (issue 25: compare-and-swap across
-- replicas). One row, written under the policy advisory lock in the transaction that records a
-- reload, a rollback, an upload or an approved proposal (with its audit events), and at each
-- replica's start-up; a replica following another's announcement does not write it. `If-Match`
-- on `POST /v1/policy/reload` and a proposal's approval compare against it (and against the
-- replica's own active revision), so two replicas cannot both apply a change of one base.
CREATE TABLE IF NOT EXISTS policy_active (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revision   text NOT NULL,
    loaded_by  text NOT NULL,                 -- a key id, `startup`, `sighup`
    source     text NOT NULL,                 -- policy_dir, dir, rollback, upload, proposal, startup
    proposal   text,                          -- the approved proposal it applied, if any
    updated_at timestamptz NOT NULL DEFAULT now()
);
REVOKE DELETE, TRUNCATE ON policy_active FROM sandgate_app;
GRANT SELECT, INSERT, UPDATE ON policy_active TO sandgate_app;
GRANT SELECT ON policy_active TO sandgate_auditor;
