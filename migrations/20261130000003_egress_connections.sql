-- One row per egress connection attempt, allowed or denied. Inserted (with its audit event)
-- before the proxy dials; completed when the connection closes.
CREATE TABLE egress_connections (
    id             text PRIMARY KEY,                  -- "cn_<uuid>"
    execution_id   text NOT NULL REFERENCES executions (id),
    tenant         text NOT NULL,
    host           text NOT NULL,                     -- canonical host as decided on
    port           integer NOT NULL,
    scheme         text NOT NULL,                     -- connect, http
    sni            text,
    method         text,
    path           text,
    resolved_addr  text,                              -- the address checked (dialled if allowed)
    allow          boolean NOT NULL,
    reason         text NOT NULL,                     -- bounded reason code
    message        text NOT NULL DEFAULT '',
    policy_revision text NOT NULL,
    opened_at      timestamptz NOT NULL,
    closed_at      timestamptz,
    bytes_up       bigint NOT NULL DEFAULT 0,
    bytes_down     bigint NOT NULL DEFAULT 0,
    duration_ms    bigint,
    close_reason   text,
    error          text
);
CREATE INDEX egress_connections_execution ON egress_connections (execution_id, opened_at);
CREATE INDEX egress_connections_denied_host ON egress_connections (host) WHERE NOT allow;
