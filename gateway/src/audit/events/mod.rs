//! The payload of each audit event kind, typed: one struct per kind (or per family) for its
//! `input` and `decision` columns, and `Vec<Reason>` for `reasons`, so the schema of an event
//! lives here and not at the call sites that write it. A new event kind adds its structs to
//! the family's file (or a new one) and builds its [`NewEvent`] from them with [`column`].
//!
//! The chain hashes the serialised row (`chain::canonical`: compact JSON, keys sorted, since
//! serde_json's map is ordered), so a struct must serialise to exactly the JSON the event had
//! before it was typed: the same keys (an absent `Option` is `null`, never skipped), the same
//! values. `tests.rs` holds that against the `json!` each replaced, byte for byte; readers of
//! stored events (OCSF export, replay) deserialise with the same structs.
//!
//! [`NewEvent`]: super::NewEvent

pub mod approvals;
pub mod egress;
pub mod execution;
pub mod keys;
pub mod policy;
pub mod proposals;
pub mod refusals;
pub mod retention;
pub mod session_files;
pub mod sessions;
pub mod snapshots;

use serde::Serialize;
use serde_json::Value;

use policy_engine::Reason;

/// A JSON column from its typed payload, exactly as `json!(payload)` made it.
pub fn column<T: Serialize>(payload: &T) -> Value {
    serde_json::json!(payload)
}

/// The `reasons` column of an event with none.
pub fn no_reasons() -> Value {
    column::<[Reason; 0]>(&[])
}

/// The `reasons` column of an event with one reason.
pub fn reason(code: &str, message: &str) -> Value {
    column(&[Reason {
        code: code.to_owned(),
        message: message.to_owned(),
    }])
}

#[cfg(test)]
mod tests;
