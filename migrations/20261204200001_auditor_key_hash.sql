-- Auditors read API keys without their hashes (issue 21): `key_hash` is the SHA-256 of the
-- whole secret, which is enough to test guesses offline and is of no use to an audit. The
-- default privileges (20261130000005) gave sandgate_auditor every column of api_keys; it keeps
-- every other one, as it does for approvals (20261130000009) and session_turns
-- (20261203200002).
REVOKE SELECT ON api_keys FROM sandgate_auditor;
GRANT SELECT (id, role, tenant, created_at, revoked_at, principal, expires_at, last_used_at)
    ON api_keys TO sandgate_auditor;
