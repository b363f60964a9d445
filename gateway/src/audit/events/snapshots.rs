//! `snapshot.created`, `snapshot.deleted` and `snapshot.expired`: a session's snapshot, its
//! image's size and digest, and its lifetime.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The input of every snapshot event: the snapshot and the session it was taken of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotOf {
    pub session_id: String,
    pub snapshot_id: String,
}

/// The decision of every snapshot event: the image, its lifetime and, for a removal, why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub bytes: i64,
    pub sha256: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub reason: Option<String>,
}
