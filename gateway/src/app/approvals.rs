//! Human review: an allowed decision with `require_approval` is held (`pending_approval`) with
//! its floor-checked, runnable form and the request payload, until a reviewer of another
//! principal approves it (it then runs exactly as reviewed, through the normal queue), rejects
//! it (`denied`, `approval.rejected`) or it expires (`denied`, `approval.expired`).
//!
//! Every step is committed with its audit event before anything else happens.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use policy_engine::{PolicyInput, Reason};

use super::floor::Runnable;
use super::overflow::Refusal;
use super::request::{ExecutionRequest, FileUpload};
use super::validate::decode_files;
use super::{App, AppError};
use crate::audit::approvals::{ApprovalRow, Held, NewApproval, PendingCaps, Verdict};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, ExecutionRow, NewEvent};

/// Longest reviewer comment.
pub const MAX_COMMENT_BYTES: usize = 1000;
/// Most approvals one page of the listing returns.
pub const MAX_LIST: i64 = 500;
/// Longest time between two expiry sweeps.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(5);

/// What an approval held: an execution or a session, as it is once decided.
#[derive(Debug)]
pub enum Subject {
    Execution(Box<ExecutionRow>),
    Session(Box<SessionRow>),
}

/// `POST /v1/approvals/{id}` body, and where an approval is.
pub use api_types::{ApprovalStatus, Review, ReviewDecision};

/// What is kept of a held request to run it later: the parts not in the policy input.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredRequest {
    language: String,
    code: String,
    files: Vec<FileUpload>,
}

impl App {
    /// Holds an allowed, floor-checked decision for review: the execution row
    /// (`pending_approval`), the approval (with the runnable decision and the payload), the
    /// decision event and `approval.requested`, in one transaction. Returns the row and the
    /// approval id; nothing runs.
    pub(super) async fn hold_for_review(
        &self,
        caller: &ApiKey,
        request: &ExecutionRequest,
        input: &PolicyInput,
        (mut row, decision_event): (ExecutionRow, NewEvent),
        runnable: &Runnable,
    ) -> Result<(ExecutionRow, String), AppError> {
        row.status = crate::status::ExecutionStatus::PendingApproval;
        let ttl = chrono::Duration::seconds(
            i64::try_from(self.config.approval_ttl_s).unwrap_or(i64::MAX / 1000),
        );
        let stored = json!(StoredRequest {
            language: request.language.clone(),
            code: request.code.clone(),
            files: request.files.clone(),
        });
        let request_bytes = serde_json::to_vec(&stored).map_or(i64::MAX, |bytes| {
            i64::try_from(bytes.len()).unwrap_or(i64::MAX)
        });
        let approval = NewApproval {
            id: crate::ids::new("ap"),
            expires_at: row.created_at + ttl,
            requester_key_id: caller.id.clone(),
            requester_principal: caller.principal.clone(),
            reasons: row.reasons.0.clone(),
            runnable: serde_json::to_value(runnable)
                .map_err(|err| AppError::Internal(format!("runnable decision: {err}")))?,
            summary: json!(input.request),
            request: stored,
            request_bytes,
        };
        let requested = NewEvent {
            kind: api_types::EventKind::ApprovalRequested,
            execution_id: Some(row.id.clone()),
            key_id: Some(caller.id.clone()),
            tenant: Some(caller.tenant.clone()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(true),
            reasons: json!(row.reasons.0),
            input: json!({
                "approval_id": approval.id,
                "requested_by": {"key_id": caller.id, "principal": caller.principal},
            }),
            decision: json!({"status": "pending", "expires_at": approval.expires_at}),
            policy_revision: Some(row.policy_revision.clone()),
        };
        let events = [decision_event, requested];
        let caps = self.pending_caps();
        let held = self
            .audit
            .record_pending_execution(&row, &approval, &events, &caps)
            .await?;
        if let Held::Full(why) = held {
            let [decision_event, _] = events;
            let refusal = Refusal::PendingApprovalLimit;
            return Err(self
                .refuse_after_decision((row, decision_event), refusal, why)
                .await);
        }
        tracing::info!(execution_id = %row.id, approval_id = %approval.id, "held for review");
        Ok((row, approval.id))
    }

    /// The configured bounds on what may wait for review.
    pub(super) fn pending_caps(&self) -> PendingCaps {
        let limits = &self.config.pending_approvals;
        let wide = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        PendingCaps {
            per_tenant: i64::from(limits.per_tenant),
            per_key: i64::from(limits.per_key),
            bytes_per_tenant: wide(limits.bytes_per_tenant),
            bytes_per_key: wide(limits.bytes_per_key),
        }
    }

    /// One page of approvals (expired ones closed first), newest first; `before` is the
    /// previous page's last id. Reviewers, auditors and admins see every tenant's, like
    /// executions.
    pub async fn list_approvals(
        &self,
        status: Option<&str>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ApprovalRow>, AppError> {
        if let Some(status) = status {
            if ApprovalStatus::parse(status).is_none() {
                let names: Vec<&str> = ApprovalStatus::ALL.iter().map(|s| s.as_str()).collect();
                return Err(AppError::Invalid(format!(
                    "status must be one of {}",
                    names.join(", ")
                )));
            }
        }
        self.expire_approvals().await?;
        Ok(self
            .audit
            .list_approvals(status, None, before, limit.clamp(1, MAX_LIST))
            .await?)
    }

    pub async fn get_approval(&self, id: &str) -> Result<ApprovalRow, AppError> {
        self.expire_approvals().await?;
        self.audit.get_approval(id).await?.ok_or(AppError::NotFound)
    }

    /// Approves or rejects. Never by the requesting key nor by a key of the requesting
    /// principal (403); a decided or expired approval is a conflict (409). On approval an
    /// execution runs its stored, reviewed decision through the queue (the returned row is then
    /// `queued`); a session's sandbox is started (`session_approvals.rs`).
    pub async fn decide_approval(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        review: Review,
    ) -> Result<(ApprovalRow, Subject), AppError> {
        let comment = review.comment.as_deref().filter(|c| !c.is_empty());
        if let Some(comment) = comment {
            check_comment(comment)?;
        }
        let approval = self.get_approval(id).await?;
        if approval.status != ApprovalStatus::Pending {
            return Err(AppError::Conflict(format!(
                "approval {id} is already {}",
                approval.status
            )));
        }
        self.refuse_self_review(caller, &approval, review.decision)
            .await?;
        let Some(execution_id) = approval.execution_id.clone() else {
            let (approval, session) = self
                .decide_session_approval(caller, &approval, &review)
                .await?;
            return Ok((approval, Subject::Session(Box::new(session))));
        };
        let approve = review.decision == ReviewDecision::Approve;
        let runnable = if approve {
            Some(self.reviewed_runnable(&approval)?)
        } else {
            None
        };
        // A slot in the queue and a place in the live set before the approval commits: a full
        // queue refuses (429) with the approval still pending, and the reaper never closes the
        // run between the commit and its start.
        let admitted = if runnable.is_some() {
            let ticket = self
                .scheduler
                .admit(&approval.tenant.clone().unwrap_or_default())
                .map_err(|full| AppError::RateLimited(full.to_string()))?;
            let live = self.live.try_track(&execution_id).ok_or_else(|| {
                AppError::Conflict(format!("approval {id} is being decided by another request"))
            })?;
            Some((ticket, live))
        } else {
            None
        };
        let verdict = self.verdict(caller, approve, comment);
        let reason = &verdict.reason;
        let event = review_event(caller, &approval, approve, comment, reason);
        let Some(decided) = self.audit.decide_approval(id, &verdict, &event).await? else {
            return Err(AppError::Conflict(format!(
                "approval {id} is no longer pending (decided or expired meanwhile)"
            )));
        };
        tracing::info!(approval_id = %id, execution_id = %execution_id, approve, "approval decided");
        let row = self
            .audit
            .get_execution(&execution_id)
            .await?
            .ok_or(AppError::NotFound)?;
        if let Some((ticket, live)) = admitted {
            self.launch_approved(row.clone(), &decided, ticket, live)?;
        }
        Ok((decided.approval, Subject::Execution(Box::new(row))))
    }

    /// The decision a reviewer approves, as stored, if it can still run here (409 if not).
    pub(super) fn reviewed_runnable(&self, approval: &ApprovalRow) -> Result<Runnable, AppError> {
        let id = &approval.id;
        let runnable: Runnable = approval
            .runnable
            .as_ref()
            .and_then(|value| serde_json::from_value(value.0.clone()).ok())
            .ok_or_else(|| {
                AppError::Internal(format!("approval {id}: stored decision unreadable"))
            })?;
        self.still_runnable(&runnable).map_err(|why| {
            AppError::Conflict(format!(
                "approval {id} cannot run as reviewed: {why}; reject it and ask again"
            ))
        })?;
        Ok(runnable)
    }

    async fn refuse_self_review(
        &self,
        caller: &ApiKey,
        approval: &ApprovalRow,
        decision: ReviewDecision,
    ) -> Result<(), AppError> {
        let message = if approval.requester_key_id.as_deref() == Some(caller.id.as_str()) {
            "a key cannot approve or reject its own request"
        } else if same_principal(approval.requester_principal.as_deref(), &caller.principal) {
            "a reviewer key of the requesting principal cannot approve its own request"
        } else {
            return Ok(());
        };
        let event = NewEvent {
            kind: api_types::EventKind::ApprovalRefused,
            execution_id: approval.execution_id.clone(),
            key_id: Some(caller.id.clone()),
            tenant: approval.tenant.clone(),
            decision_id: None,
            allow: Some(false),
            reasons: json!([{"code": "approval.self_review", "message": message}]),
            input: json!({
                "approval_id": approval.id,
                "session_id": approval.session_id,
                "decision": if decision == ReviewDecision::Approve { "approve" } else { "reject" },
                "reviewer": {"key_id": caller.id, "principal": caller.principal},
            }),
            decision: json!({"status": approval.status}),
            policy_revision: None,
        };
        self.audit.record_event(&event).await?;
        Err(AppError::Forbidden(message.to_owned()))
    }

    /// Starts an approved execution with the decision that was reviewed, not a new one.
    fn launch_approved(
        self: &Arc<Self>,
        row: ExecutionRow,
        decided: &crate::audit::approvals::Decided,
        ticket: super::scheduler::Ticket,
        live: super::reaper::LiveGuard,
    ) -> Result<(), AppError> {
        let broken = |what: &str, err: &dyn std::fmt::Display| {
            // The row stays `queued` without a live run: the reaper closes it as `error`.
            AppError::Internal(format!("approved execution {}: {what}: {err}", row.id))
        };
        let runnable: Runnable = decided
            .runnable
            .clone()
            .ok_or_else(|| broken("runnable", &"missing"))
            .and_then(|v| serde_json::from_value(v).map_err(|err| broken("runnable", &err)))?;
        let stored: StoredRequest = decided
            .request
            .clone()
            .ok_or_else(|| broken("request", &"missing"))
            .and_then(|v| serde_json::from_value(v).map_err(|err| broken("request", &err)))?;
        let files = decode_files(&stored.files)?;
        let program = super::launch::Program {
            language: stored.language,
            code: stored.code,
            files,
        };
        self.launch(super::launch::Launch {
            row,
            program,
            runnable,
            live,
            ticket,
        });
        Ok(())
    }

    /// Closes every pending approval past its expiry (`denied`, `approval.expired`).
    pub async fn expire_approvals(&self) -> Result<usize, AppError> {
        let expired = self.audit.expire_approvals().await?;
        for approval in &expired {
            tracing::info!(approval_id = %approval.id, execution_id = ?approval.execution_id, session_id = ?approval.session_id, "approval expired");
        }
        Ok(expired.len())
    }
}

fn verb(approve: bool) -> &'static str {
    if approve {
        ApprovalStatus::Approved.as_str()
    } else {
        ApprovalStatus::Rejected.as_str()
    }
}

impl App {
    /// Withdraws a request held for review (`POST /v1/executions/{id}/cancel` on a
    /// `pending_approval` execution, by an agent of its tenant or an admin): audited as
    /// `approval.withdrawn`, the execution ends `cancelled`, and nothing ever runs. Returns
    /// the final record; a request decided meanwhile is a conflict.
    pub(super) async fn withdraw_request(
        &self,
        caller: &ApiKey,
        row: &ExecutionRow,
    ) -> Result<ExecutionRow, AppError> {
        let reason = Reason {
            code: "approval.withdrawn".to_owned(),
            message: format!(
                "withdrawn by {} ({}) before review",
                caller.principal, caller.id
            ),
        };
        let event = NewEvent {
            kind: api_types::EventKind::ApprovalWithdrawn,
            execution_id: Some(row.id.clone()),
            key_id: Some(caller.id.clone()),
            tenant: Some(row.tenant.clone()),
            decision_id: None,
            allow: Some(false),
            reasons: json!([reason]),
            input: json!({}),
            decision: json!({"status": "withdrawn"}),
            policy_revision: None,
        };
        match self
            .audit
            .withdraw_approval(&row.id, &reason, &event)
            .await?
        {
            Some(_) => self.get_execution(caller, &row.id).await,
            None => {
                let now = self.get_execution(caller, &row.id).await?;
                Err(AppError::Conflict(format!(
                    "execution {} is no longer waiting for review (it is {})",
                    row.id, now.status
                )))
            }
        }
    }
}

/// The reason added to the execution: `approval.approved` / `approval.rejected`, naming the
/// reviewer's principal and carrying the comment.
impl App {
    /// This gateway's verdict on an approval, by `caller` (the execution's or session's
    /// reasons gain `approval.approved` / `approval.rejected`).
    pub(super) fn verdict<'a>(
        &'a self,
        caller: &'a ApiKey,
        approve: bool,
        comment: Option<&'a str>,
    ) -> Verdict<'a> {
        Verdict {
            approve,
            reviewer_key_id: &caller.id,
            reviewer_principal: &caller.principal,
            comment,
            instance: &self.instance,
            lease_ms: self.config.lease_ms,
            reason: verdict_reason(approve, &caller.principal, comment),
        }
    }
}

fn verdict_reason(approve: bool, principal: &str, comment: Option<&str>) -> Reason {
    Reason {
        code: format!("approval.{}", verb(approve)),
        message: match comment {
            Some(comment) => format!("{} by {principal}: {comment}", verb(approve)),
            None => format!("{} by {principal}", verb(approve)),
        },
    }
}

pub(super) fn review_event(
    caller: &ApiKey,
    approval: &ApprovalRow,
    approve: bool,
    comment: Option<&str>,
    reason: &Reason,
) -> NewEvent {
    NewEvent {
        kind: if approve {
            api_types::EventKind::ApprovalApproved
        } else {
            api_types::EventKind::ApprovalRejected
        },
        execution_id: approval.execution_id.clone(),
        key_id: Some(caller.id.clone()),
        tenant: approval.tenant.clone(),
        decision_id: None,
        allow: Some(approve),
        reasons: json!([reason]),
        input: json!({
            "approval_id": approval.id,
            "session_id": approval.session_id,
            "reviewer": {"key_id": caller.id, "principal": caller.principal, "role": caller.role},
            "requested_by": {
                "key_id": approval.requester_key_id,
                "principal": approval.requester_principal,
            },
            "comment": comment,
        }),
        decision: json!({"status": verb(approve), "runnable": approval.runnable}),
        policy_revision: None,
    }
}

/// Whether two stored principals are one party: compared in normalised form, whatever was
/// stored (rows from before normalisation, or written by other tools).
fn same_principal(requester: Option<&str>, reviewer: &str) -> bool {
    let canonical = |p: &str| crate::principal::normalise(p).unwrap_or_else(|_| p.to_owned());
    requester.is_some_and(|requester| canonical(requester) == canonical(reviewer))
}

fn check_comment(comment: &str) -> Result<(), AppError> {
    let control = comment.chars().any(|c| c.is_control() && c != '\n');
    if comment.len() > MAX_COMMENT_BYTES || control {
        return Err(AppError::Invalid(format!(
            "comment must be at most {MAX_COMMENT_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// Expires overdue approvals until shutdown, at least every few seconds (and never less often
/// than the TTL itself).
pub async fn expire_periodically(app: Arc<App>) {
    let ttl = Duration::from_secs(app.config.approval_ttl_s.max(1));
    let interval = EXPIRY_INTERVAL.min(ttl);
    loop {
        if let Err(err) = app.expire_approvals().await {
            tracing::warn!(error = %super::error_chain(&err), "expiring approvals failed");
        }
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_compare_in_normalised_form() {
        assert!(same_principal(Some("a1"), "a1 "));
        assert!(same_principal(Some("A1"), "a1"));
        assert!(same_principal(Some("ａ１"), "a1"));
        assert!(!same_principal(Some("a1"), "a2"));
        assert!(!same_principal(None, "a1"));
    }

    #[test]
    fn comments_are_bounded() {
        assert!(check_comment("fine\nby me").is_ok());
        assert!(check_comment("bell\u{7}").is_err());
        assert!(check_comment(&"x".repeat(MAX_COMMENT_BYTES + 1)).is_err());
    }

    #[test]
    fn review_bodies_are_strict() {
        let ok: Review = serde_json::from_str(r#"{"decision":"approve"}"#).unwrap();
        assert_eq!(ok.decision, ReviewDecision::Approve);
        assert!(serde_json::from_str::<Review>(r#"{"decision":"maybe"}"#).is_err());
        assert!(serde_json::from_str::<Review>(r#"{"decision":"reject","x":1}"#).is_err());
    }
}
