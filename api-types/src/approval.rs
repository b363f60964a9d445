//! `/v1/approvals`: executions and sessions held for human review, as
//! reviewers see and decide them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::execution::ExecutionView;
use crate::policy::Reason;
use crate::session::SessionView;

/// Where an approval is (the store's CHECK constraint has the same set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    /// Waits for a reviewer.
    Pending,
    /// A reviewer approved it; the execution ran (or runs).
    Approved,
    /// A reviewer rejected it; the execution is `denied`.
    Rejected,
    /// Nobody decided in time; the execution is `denied`.
    Expired,
    /// What it held went away before anyone decided (e.g. its session closed).
    Withdrawn,
}

crate::text_forms::text_forms!(ApprovalStatus {
    Pending => "pending",
    Approved => "approved",
    Rejected => "rejected",
    Expired => "expired",
    Withdrawn => "withdrawn",
});

/// An approval as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalView {
    pub id: String,
    /// What is held: an execution or a session.
    pub subject: SubjectKind,
    /// The execution held (`null` for a session's approval).
    pub execution_id: Option<String>,
    /// The session held (absent for an execution's approval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub status: ApprovalStatus,
    pub tenant: Option<String>,
    pub requested_by: Party,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    /// Who approved or rejected it (absent while pending and when it expired).
    pub reviewer: Option<Party>,
    pub comment: Option<String>,
    /// Why the policy sent it to review.
    pub reasons: Vec<Reason>,
    /// What runs once approved: backend, runtime, image, limits, mounts, network grant.
    pub decision: Option<Value>,
    /// What was asked (the policy input's request: language, code sha256, files, network...;
    /// for a session also its `idle_timeout_s` and `ttl_s`).
    pub request: Option<Value>,
    /// The start of the program text, while pending.
    pub code_preview: Option<String>,
}

/// What an approval holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SubjectKind {
    Execution,
    Session,
}

/// A key and the principal behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Party {
    pub key_id: Option<String>,
    pub principal: Option<String>,
}

/// `GET /v1/approvals`: a page, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalPage {
    pub approvals: Vec<ApprovalView>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<String>,
}

/// The body of `POST /v1/approvals/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Review {
    pub decision: ReviewDecision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReviewDecision {
    Approve,
    Reject,
}

/// The answer to `POST /v1/approvals/{id}`: the approval and what it held, its execution
/// (`queued` once approved) or its session (`ready` once approved).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecidedApproval {
    pub approval: ApprovalView,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<ExecutionView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_spelt_as_their_text() {
        crate::text_forms::assert_serde_matches(ApprovalStatus::ALL, |status| status.as_str());
        assert_eq!(ApprovalStatus::parse("denied"), None);
    }

    #[test]
    fn a_review_is_strict() {
        let review: Review = serde_json::from_str(r#"{"decision":"approve"}"#).unwrap();
        assert_eq!(review.decision, ReviewDecision::Approve);
        assert!(serde_json::from_str::<Review>(r#"{"decision":"ok"}"#).is_err());
        assert!(serde_json::from_str::<Review>(r#"{"decision":"reject","why":"x"}"#).is_err());
    }
}
