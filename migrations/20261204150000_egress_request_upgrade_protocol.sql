-- What an inspected request's `Upgrade` asked for (issue 21 item 7): `websocket`, `h2c`, ...;
-- NULL without an Upgrade header. With `status_code` 101 it says what the connection became
-- (the proxy refuses a 101 that switches to any other protocol). The path column now holds the
-- normalised path the policy decided on and the upstream was sent (issue 21 item 2).
ALTER TABLE egress_requests ADD COLUMN upgrade_protocol text;
COMMENT ON COLUMN egress_requests.upgrade_protocol IS
    'the protocol the request''s Upgrade header asked for, lower case; NULL without one';
COMMENT ON COLUMN egress_requests.path IS
    'the normalised path decided on and forwarded (no query); as sent when refused as path_invalid';
