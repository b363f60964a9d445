-- Policy changes as reviewed proposals (issue 25): a JSON merge patch per data file of the
-- bundle, with the revision it was built on (`base_revision`), the revision the patched bundle
-- reads as (`candidate_revision`) and the evidence computed when it was built (its tests and a
-- replay of recent decisions). Only an open proposal changes: approved, rejected or rebased
-- onto a new base; each step is also an audit event (`policy.proposed`,
-- `policy.proposal.approved`, `policy.proposal.rejected`).
CREATE TABLE IF NOT EXISTS policy_proposals (
    id                 text PRIMARY KEY,                 -- pp_...
    created_at         timestamptz NOT NULL DEFAULT now(),
    title              text NOT NULL,
    rationale          text NOT NULL,
    -- Who opened it: a reviewer or admin key, or an agent asking for access (`agent`).
    author_key_id      text NOT NULL,
    author_principal   text NOT NULL,
    author_tenant      text NOT NULL,
    origin             text NOT NULL CHECK (origin IN ('reviewer', 'agent')),
    -- The agent's own words when it asked; shown to reviewers as such, never trusted.
    justification      text,
    source_execution   text,
    source_approval    text,
    patch              jsonb NOT NULL,                   -- {"data/<file>.yaml": <merge patch>}
    base_revision      text NOT NULL,
    candidate_revision text NOT NULL,
    evidence           jsonb NOT NULL,                   -- {"tests": ..., "replay": ...}
    tests_passed       boolean NOT NULL,
    status             text NOT NULL DEFAULT 'open'
                       CHECK (status IN ('open', 'approved', 'rejected')),
    decided_at         timestamptz,
    decided_by         text,
    comment            text
);
CREATE INDEX IF NOT EXISTS policy_proposals_listing ON policy_proposals (created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS policy_proposals_open_key ON policy_proposals (author_key_id)
    WHERE status = 'open';
CREATE INDEX IF NOT EXISTS policy_proposals_open_tenant ON policy_proposals (author_tenant)
    WHERE status = 'open';
REVOKE DELETE, TRUNCATE ON policy_proposals FROM sandgate_app;
GRANT SELECT, INSERT, UPDATE ON policy_proposals TO sandgate_app;
GRANT SELECT ON policy_proposals TO sandgate_auditor;
