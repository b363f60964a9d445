//! `approval.requested` (an execution or a session held for review), `approval.approved`,
//! `approval.rejected`, `approval.refused`, `approval.expired` and
//! `approval.withdrawn`: an execution or a session held for review, decided by a reviewer,
//! refused as a self-review, left to expire, or withdrawn before anyone decided.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::ApprovalId;
use serde_json::Value;

use api_types::{ApprovalStatus, ReviewDecision};
use policy_engine::{Decision, PolicyInput};

use crate::role::Role;

/// A key and its principal (who refused or denied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Party {
    pub key_id: String,
    pub principal: String,
}

/// The reviewer of a decided approval, with its role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reviewer {
    pub key_id: String,
    pub principal: String,
    pub role: Role,
}

/// Who asked for what was held, as the approval stored it (absent on old rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Requester {
    pub key_id: Option<String>,
    pub principal: Option<String>,
}

/// `approval.approved` and `approval.rejected`'s input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reviewed {
    pub approval_id: ApprovalId,
    pub session_id: Option<String>,
    pub reviewer: Reviewer,
    pub requested_by: Requester,
    pub comment: Option<String>,
}

/// `approval.approved` and `approval.rejected`'s decision: the new status and what runs once
/// approved (the stored runnable decision; `null` when the row has none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub status: ApprovalStatus,
    pub runnable: Option<Value>,
}

/// `approval.refused`'s input: a reviewer tried to decide its own (or its principal's) request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfReview {
    pub approval_id: ApprovalId,
    pub session_id: Option<String>,
    pub decision: ReviewDecision,
    pub reviewer: Party,
}

/// The decision of `approval.refused` (the status it keeps), `approval.expired` and
/// `approval.withdrawn` (the status it took).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub status: ApprovalStatus,
}

/// `approval.expired`'s input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expiry {
    pub approval_id: ApprovalId,
    pub session_id: Option<String>,
    pub expires_at: DateTime<Utc>,
}

/// `approval.withdrawn`'s input for a held execution: the approval and the key that withdrew
/// it (the event's `key_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionWithdrawal {
    pub approval_id: ApprovalId,
    pub requested_by: Option<String>,
}

/// `approval.withdrawn`'s input for a held session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionWithdrawal {
    pub approval_id: ApprovalId,
    pub session_id: String,
    pub requested_by: Option<String>,
}

/// `approval.requested`'s input for a held execution (its decision event carries the policy
/// input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRequested {
    pub approval_id: ApprovalId,
    pub requested_by: Party,
}

/// `approval.requested`'s decision for a held execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub status: ApprovalStatus,
    pub expires_at: DateTime<Utc>,
}

/// `approval.requested`'s input for a held session (its only decision event): the policy input
/// too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRequested {
    pub approval_id: ApprovalId,
    pub session_id: String,
    pub requested_by: Party,
    pub request: PolicyInput,
}

/// `approval.requested`'s decision for a held session: `require_approval` at the top (so
/// `v_decisions` counts it as a review outcome) and what the policy said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionPending {
    pub status: ApprovalStatus,
    pub expires_at: DateTime<Utc>,
    pub require_approval: bool,
    pub policy: Decision,
}

/// How a pending approval was withdrawn with its requester's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WithdrawnVia {
    /// The key was revoked over the API.
    KeyRevokedApi,
    /// The key was revoked from the command line.
    KeyRevokedCommandLine,
}

/// `approval.withdrawn`'s input when revoking the requester's key withdrew it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyWithdrawal {
    pub approval_id: ApprovalId,
    pub session_id: Option<String>,
    pub requested_by: String,
    pub via: WithdrawnVia,
}
