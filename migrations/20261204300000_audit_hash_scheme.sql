-- The hash scheme of each audit event (gateway/src/audit/chain.rs, `HashScheme`).
--
-- Every event written before this migration was hashed as sha256(prev_hash || canonical row)
-- (scheme 1) and keeps that hash: the default fills the column for them without rewriting a row
-- (a constant default is stored in the catalog, so the append-only triggers never fire). The
-- gateway writes every new event with scheme 2,
--   sha256(prev_hash || stamp || tenant_tag || sha256(canonical row)),
--   stamp = sha256({"at":A,"seq":S}), tenant_tag = sha256({"seq":S,"tenant":T}) (hex, compact JSON),
-- whose link, seq and time an export bundle can prove without the event's content. A gateway of
-- an older version that still appends during a rolling upgrade writes scheme 1 and gets the
-- default: also right (docs/audit.md, "Rolling upgrades").
ALTER TABLE audit_events
    ADD COLUMN hash_version smallint NOT NULL DEFAULT 1
    CONSTRAINT audit_events_hash_version CHECK (hash_version IN (1, 2));
