-- One row per HTTP request inside an inspected tunnel (DESIGN section 11), allowed or denied.
-- Inserted (with its `egress.request` audit event) before anything of the request is forwarded;
-- completed when the response has been relayed. It names credentials, never their values; the
-- query string is kept only as its SHA-256 (queries may carry secrets).
CREATE TABLE egress_requests (
    id             text PRIMARY KEY,                  -- "rq_<uuid>"
    connection_id  text NOT NULL REFERENCES egress_connections (id),
    execution_id   text NOT NULL REFERENCES executions (id),
    tenant         text NOT NULL,
    host           text NOT NULL,
    port           integer NOT NULL,
    method         text NOT NULL,
    path           text NOT NULL,                     -- as the sandbox sent it, no query
    query_sha256   text,
    header_names   text[] NOT NULL DEFAULT '{}',
    credentials    text[] NOT NULL DEFAULT '{}',      -- attached (allowed) or misdirected (denied)
    upgrade        boolean NOT NULL DEFAULT false,
    allow          boolean NOT NULL,
    reason         text NOT NULL,                     -- bounded reason code
    message        text NOT NULL DEFAULT '',
    policy_revision text NOT NULL,
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz,
    status_code    integer,
    bytes_up       bigint NOT NULL DEFAULT 0,
    bytes_down     bigint NOT NULL DEFAULT 0,
    duration_ms    bigint,
    error          text
);
CREATE INDEX egress_requests_execution ON egress_requests (execution_id, started_at);
CREATE INDEX egress_requests_connection ON egress_requests (connection_id);

REVOKE ALL ON egress_requests FROM sandgate_app;
GRANT SELECT, INSERT, UPDATE ON egress_requests TO sandgate_app;
GRANT SELECT ON egress_requests TO sandgate_auditor;

-- Requests by host, method and decision; credential use by tenant (dashboard panels).
CREATE VIEW v_egress_requests AS
SELECT r.started_at, r.tenant, r.execution_id, r.host, r.method, r.path, r.allow, r.reason,
       r.credentials, r.status_code, r.bytes_up, r.bytes_down, r.duration_ms
FROM egress_requests AS r;

CREATE VIEW v_credential_use AS
SELECT r.tenant, credential, r.host, r.allow, r.reason, count(*) AS requests,
       max(r.started_at) AS last_used
FROM egress_requests AS r, unnest(r.credentials) AS credential
GROUP BY r.tenant, credential, r.host, r.allow, r.reason;

REVOKE ALL ON v_egress_requests, v_credential_use FROM sandgate_app;
GRANT SELECT ON v_egress_requests, v_credential_use TO sandgate_app, sandgate_auditor;
