-- Hardening of access (issue 15, items 7, 12, 13): keys that can die, principals in one
-- spelling, bounded pending approvals.

-- Keys that can die: an optional expiry and the last time the key authenticated a request (to
-- the minute). A key is live while revoked_at is unset and expires_at lies ahead.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS expires_at timestamptz;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS last_used_at timestamptz;
-- The gateway may revoke keys and mark them used; nothing else of a key ever changes (role,
-- tenant, principal, hash and expiry are fixed at creation).
GRANT UPDATE (revoked_at, last_used_at) ON api_keys TO sandgate_app;

-- Principals in one spelling (the gateway's crate::principal is the authority: NFKC, trimmed,
-- inner white space one space, case folded). This SQL form is the second line for no-self-review:
-- both sides of the comparison go through it, so rows written before this migration or by other
-- tools compare in the same form. NFKC needs a UTF8 database; elsewhere only trimming and ASCII
-- case apply (`lower` folds only ASCII under the C locale the embedded cluster uses).
DO $$
BEGIN
    IF current_setting('server_encoding') = 'UTF8' THEN
        CREATE OR REPLACE FUNCTION sandgate_principal(p text) RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $f$ SELECT lower(btrim(regexp_replace(normalize(p, NFKC), '\s+', ' ', 'g'))) $f$;
    ELSE
        CREATE OR REPLACE FUNCTION sandgate_principal(p text) RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $f$ SELECT lower(btrim(regexp_replace(p, '\s+', ' ', 'g'))) $f$;
    END IF;
END
$$;
GRANT EXECUTE ON FUNCTION sandgate_principal(text) TO sandgate_app;
UPDATE api_keys SET principal = sandgate_principal(principal)
    WHERE principal IS DISTINCT FROM sandgate_principal(principal);
UPDATE approvals SET requester_principal = sandgate_principal(requester_principal)
    WHERE requester_principal IS DISTINCT FROM sandgate_principal(requester_principal);

-- Bounded pending approvals: what a held request stores (its payload, in bytes), so the caps on
-- pending approvals per tenant and per key can count bytes as well as requests.
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS request_bytes bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS approvals_pending_by_tenant ON approvals (tenant) WHERE status = 'pending';
-- The approvals listing pages newest first, like executions.
CREATE INDEX IF NOT EXISTS approvals_created ON approvals (created_at DESC, id DESC);
