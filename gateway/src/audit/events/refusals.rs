//! `auth.failure`, `request.traversal`, `request.cross_tenant`, `queue.refused` and their
//! `*.repeated` summaries: requests refused before anything was decided. The first refusal of
//! a window is its own event; the rest of the window is counted into one summary.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A first refusal's input: where it came from and what was asked (bounded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refused {
    /// The client's address, when known.
    pub source: Option<String>,
    /// The key id a failed authentication claimed (never trusted for anything else).
    pub claimed_key_id: Option<String>,
    pub request: Value,
}

/// A summary's input: the window and the last refusal counted in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefusedRepeatedly {
    pub source: Option<String>,
    pub claimed_key_id: Option<String>,
    pub window_start: DateTime<Utc>,
    pub window_end: DateTime<Utc>,
    pub last: Value,
}

/// A summary's decision: refused `repeats` more times, `throttled` of them with 429.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repeats {
    pub allow: bool,
    pub repeats: u64,
    pub throttled: u64,
}
