//! Forging an exported audit bundle, through the real binary and a real PostgreSQL: a tenant's
//! event edited with its hash recomputed and the next omitted event relinked, a tenant's event
//! hidden as another tenant's, the end of the chain cut off, the whole slice rehashed; and a
//! chain written with the old hash scheme (scheme 1) still verifying after new events join it,
//! with a filtered bundle that says what it cannot prove instead of `ok`.
//!
//! The forger here is written apart from the gateway's code, from the hash definitions in
//! docs/audit.md, as anyone holding a bundle could write it.

mod edits;
mod forger;
mod old_scheme;
mod windows;
