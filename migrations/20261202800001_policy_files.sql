-- The files of each policy revision, so an audit export can carry the bundle that made its
-- decisions and an auditor can recompute the revision offline (`sandgate audit export`). Rows
-- are written with the revision, once, and never change: the gateway may read and insert only.
-- Revisions recorded before this migration have no rows here; their exports say so.
CREATE TABLE IF NOT EXISTS policy_revision_files (
    revision  text NOT NULL REFERENCES policy_revisions (revision),
    path      text NOT NULL,                          -- relative to the bundle root, `/`-separated
    contents  text NOT NULL,
    PRIMARY KEY (revision, path)
);
REVOKE UPDATE, DELETE, TRUNCATE ON policy_revision_files FROM sandgate_app;
GRANT SELECT, INSERT ON policy_revision_files TO sandgate_app;
GRANT SELECT ON policy_revision_files TO sandgate_auditor;
