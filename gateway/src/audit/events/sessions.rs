//! `session.denied` and `session.closed` of a session held for review: rejected by a reviewer,
//! or closed while it still waited (its approval expired or was withdrawn). The other session
//! events are written where sessions run and are not typed here yet.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use api_types::{ApprovalStatus, ClosedReason};

use super::approvals::Party;

/// `session.denied`'s input: the session, its approval and the reviewer who rejected it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Denial {
    pub session_id: String,
    pub approval_id: String,
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
    pub approval_id: Option<String>,
}

/// `session.closed`'s decision for a held session: why, how many executions (none ran), when
/// it was opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldClosed {
    pub closed_reason: Option<ClosedReason>,
    pub executions: i64,
    pub created_at: DateTime<Utc>,
}
