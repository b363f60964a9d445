//! Identifiers and timestamps shared by every module.

use chrono::{DateTime, SubsecRound, Utc};

/// A new identifier `<prefix>_<uuid v7, simple form>`: unique, and sortable by creation time.
pub fn new(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// The current time at PostgreSQL's precision, so values round-trip exactly (the audit chain
/// hashes them).
pub fn now_micros() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}
