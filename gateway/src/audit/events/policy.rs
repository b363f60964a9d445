//! `policy.reload` and `policy.evaluate`: the policy bundle changed (or a change was refused),
//! and an admin or reviewer asked the active policy a question without running anything.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `policy.reload`'s input: where the bundle came from and who loaded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reload {
    /// `file` (a signal or the start), `upload` (the API), `replica` (stored by another one).
    pub source: String,
    pub policy_dir: String,
    pub loaded_by: String,
}

/// `policy.reload`'s decision: accepted (then `revision` is the new one) or refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reloaded {
    pub accepted: bool,
    pub revision: Option<String>,
    pub previous: String,
}

/// Which of the policy's questions `POST /v1/policy/evaluate` asks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryPoint {
    #[default]
    Execution,
    Egress,
}

/// `policy.evaluate`'s input: the entry point asked and the input given (bounded: a large
/// input is kept as its size and SHA-256). The decision is the policy's own, as it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluate {
    pub entry_point: EntryPoint,
    pub input: Value,
}
