//! The session events: `session.created` (opened at once, or once a reviewer approved it),
//! `session.denied` and `session.closed` (a held one rejected, or closed while it still
//! waited; an open one closed), `session.paused`, `session.resumed` and `snapshot.corrupt`
//! (a paused session's image whose bytes changed).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::ApprovalId;

use api_types::{ApprovalStatus, ClosedReason};
use policy_engine::PolicyInput;

use super::approvals::Party;

/// The input of `session.closed`, `session.paused`, `session.resumed` and `snapshot.corrupt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRef {
    pub session_id: String,
}

/// `session.created`'s (and `session.denied`'s, when the policy denied it) input: the session
/// and what the policy was asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Opened {
    pub session_id: String,
    pub request: PolicyInput,
}

/// `session.created`'s input for a session a reviewer approved (its decision is the stored one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovedOpen {
    pub session_id: String,
    pub approval_id: ApprovalId,
    pub reviewer: Party,
    /// A fork's snapshot, as its image was checked; absent for a session started fresh (and
    /// in every event written before forks could be held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<ForkSource>,
}

/// The snapshot an approved fork was restored from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkSource {
    pub id: String,
    pub session_id: String,
    pub sha256: String,
}

/// `session.paused`'s decision: the checkpoint's size and digest, and how long it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub bytes: u64,
    pub sha256: String,
    pub took_ms: u128,
}

/// `session.resumed`'s decision: the checkpoint restored, where the time went, the replica
/// that restored it and the one it was paused on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    pub sha256: String,
    pub bytes: u64,
    pub restore_ms: u128,
    pub check_ms: u128,
    pub replica: String,
    pub paused_on: String,
}

/// What a corrupt image was refused for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorruptUse {
    Restore,
}

/// `snapshot.corrupt`'s decision: the digest the image should have had, and what was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Corrupt {
    pub sha256: String,
    pub refused: CorruptUse,
}

/// `session.denied`'s input: the session, its approval and the reviewer who rejected it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Denial {
    pub session_id: String,
    pub approval_id: ApprovalId,
    pub reviewer: Party,
}

/// `session.denied`'s decision: the approval rejected, the session closed `denied`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Denied {
    pub status: ApprovalStatus,
    pub closed_reason: ClosedReason,
}

/// `session.closed`'s input for a held session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldSession {
    pub session_id: String,
    pub approval_id: Option<ApprovalId>,
}

/// `session.closed`'s decision: why, how many executions (none, for a held session), when it
/// was opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldClosed {
    pub closed_reason: Option<ClosedReason>,
    pub executions: i64,
    pub created_at: DateTime<Utc>,
}
