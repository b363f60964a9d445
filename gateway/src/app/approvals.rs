//! Human review, one flow for every subject the pipeline holds (`pipeline.rs`): an allowed
//! decision with `require_approval` is held (`pending_approval`) with its floor-checked,
//! runnable form and what acting on it needs, until a reviewer of another principal approves
//! it, rejects it, or it expires; its agent may withdraw it meanwhile. Approved, it runs exactly
//! as reviewed (`approved.rs`): an execution through the normal queue, a session's sandbox
//! started on the deciding replica. Rejected or expired, an execution ends `denied`, a session
//! `closed` (`denied` / `expired`).
//!
//! Every step is committed with its audit events before anything else happens
//! (`audit::approvals`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use policy_engine::Reason;

use super::approved::Admission;
use super::floor::Runnable;
use super::{App, AppError};
use crate::audit::approvals::{
    ApprovalRow, ApprovalSubject, Held, NewApproval, Pending, PendingCaps, Verdict, Withdrawn,
};
use crate::audit::events::{self, approvals as approval_events, sessions as session_events};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, ExecutionRow, NewEvent};
use crate::ids::ApprovalId;

/// Longest reviewer comment.
pub const MAX_COMMENT_BYTES: usize = 1000;
/// Most approvals one page of the listing returns.
pub const MAX_LIST: i64 = 500;
/// Longest time between two expiry sweeps.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(5);

/// What a decided approval held, as it now is: an execution or a session.
#[derive(Debug)]
pub enum Reviewed {
    Execution(Box<ExecutionRow>),
    Session(Box<SessionRow>),
}

/// `POST /v1/approvals/{id}` body, and where an approval is.
pub use api_types::{ApprovalStatus, Review, ReviewDecision};

/// A subject held for review, as its approval keeps it.
pub(super) struct Hold<'a> {
    pub(super) caller: &'a ApiKey,
    /// When it was asked for: the approval expires `approval_ttl_s` after.
    pub(super) asked_at: DateTime<Utc>,
    pub(super) reasons: Vec<Reason>,
    /// What runs once approved, exactly as reviewed.
    pub(super) runnable: &'a Runnable,
    /// What reviewers see of the request (the policy input's request part).
    pub(super) summary: Value,
    /// What acting on the approval needs that the policy input does not keep; counted against
    /// the pending caps, cleared once decided.
    pub(super) stored: Value,
}

impl App {
    /// The approval of a subject to hold (not stored yet).
    pub(super) fn new_approval(&self, hold: Hold<'_>) -> Result<NewApproval, AppError> {
        let ttl = chrono::Duration::seconds(
            i64::try_from(self.config.approval_ttl_s).unwrap_or(i64::MAX / 1000),
        );
        let request_bytes = serde_json::to_vec(&hold.stored).map_or(i64::MAX, |bytes| {
            i64::try_from(bytes.len()).unwrap_or(i64::MAX)
        });
        Ok(NewApproval {
            id: crate::ids::new("ap").into(),
            expires_at: hold.asked_at + ttl,
            requester_key_id: hold.caller.id.clone(),
            requester_principal: hold.caller.principal.clone(),
            reasons: hold.reasons,
            runnable: serde_json::to_value(hold.runnable)
                .map_err(|err| AppError::Internal(format!("runnable decision: {err}")))?,
            summary: hold.summary,
            request: hold.stored,
            request_bytes,
        })
    }

    /// Commits the subject's pending row, its approval and `events` in one transaction, within
    /// the configured caps on what may wait (`Held::Full` / `Held::SessionsFull`: nothing
    /// stored; the subject records the refusal).
    pub(super) async fn commit_hold(
        &self,
        pending: Pending<'_>,
        approval: &NewApproval,
        events: &[NewEvent],
    ) -> Result<Held, AppError> {
        let caps = self.pending_caps();
        Ok(self
            .audit
            .record_pending(pending, approval, events, &caps)
            .await?)
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
        let id = ApprovalId::from(id);
        self.audit
            .get_approval(&id)
            .await?
            .ok_or(AppError::NotFound)
    }

    /// Approves or rejects. Never by the requesting key nor by a key of the requesting
    /// principal (403); a decided or expired approval is a conflict (409). Approved, the
    /// subject runs as reviewed (`approved.rs`): an execution through the queue (the answer is
    /// then `queued`), a session's sandbox started here (`ready`, or `closed` `start_failed`).
    /// Rejected: the execution `denied`, the session `closed` (`denied`).
    pub async fn decide_approval(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        review: Review,
    ) -> Result<(ApprovalRow, Reviewed), AppError> {
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
        let subject = approval
            .subject()
            .ok_or_else(|| AppError::Internal(format!("approval {id} holds no subject")))?;
        let approve = review.decision == ReviewDecision::Approve;
        let admitted = if approve {
            Some(self.admit_approved(&approval, subject)?)
        } else {
            None
        };
        // From the commit on, a task of its own: a reviewer whose connection goes away never
        // leaves the subject approved but not started (an execution launched, a session
        // opened, or closed `start_failed`).
        let app = Arc::clone(self);
        let (reviewer, comment) = (caller.clone(), comment.map(str::to_owned));
        self.tasks
            .spawn(async move {
                let review = (approve, comment.as_deref());
                app.commit_review(&reviewer, approval, review, admitted)
                    .await
            })
            .await
            .map_err(|err| AppError::Internal(format!("deciding approval {id} failed: {err}")))?
    }

    /// Commits the review with its events (an approval decided meanwhile is a conflict), then
    /// acts on it (`approved.rs`).
    async fn commit_review(
        self: &Arc<Self>,
        caller: &ApiKey,
        approval: ApprovalRow,
        (approve, comment): (bool, Option<&str>),
        admitted: Option<Admission>,
    ) -> Result<(ApprovalRow, Reviewed), AppError> {
        let id = approval.id.as_str();
        let subject = approval
            .subject()
            .ok_or_else(|| AppError::Internal(format!("approval {id} holds no subject")))?;
        let verdict = self.verdict(caller, approve, comment);
        let reason = &verdict.reason;
        let mut events = vec![review_event(caller, &approval, approve, comment, reason)];
        if let (ApprovalSubject::Session(session_id), false) = (subject, approve) {
            events.push(session_denied_event(caller, &approval, session_id, reason));
        }
        let decided = self
            .audit
            .decide_approval(&approval.id, subject, &verdict, &events)
            .await?;
        let Some(decided) = decided else {
            return Err(AppError::Conflict(format!(
                "approval {id} is no longer pending (decided, expired or withdrawn meanwhile)"
            )));
        };
        tracing::info!(approval_id = %id, subject = ?subject, approve, "approval decided");
        self.act_on_review(caller, &approval, decided, admitted)
            .await
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
            reasons: events::reason("approval.self_review", message),
            input: events::column(&approval_events::SelfReview {
                approval_id: approval.id.clone(),
                session_id: approval.session_id.clone(),
                decision,
                reviewer: party(caller),
            }),
            decision: events::column(&approval_events::Status {
                status: approval.status,
            }),
            policy_revision: None,
        };
        self.audit.record_event(&event).await?;
        Err(AppError::Forbidden(message.to_owned()))
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
    status_of(approve).as_str()
}

fn status_of(approve: bool) -> ApprovalStatus {
    if approve {
        ApprovalStatus::Approved
    } else {
        ApprovalStatus::Rejected
    }
}

/// A key as an approval event names it.
fn party(key: &ApiKey) -> approval_events::Party {
    approval_events::Party {
        key_id: key.id.clone(),
        principal: key.principal.clone(),
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
        let subject = ApprovalSubject::Execution(&row.id);
        match self.withdraw(caller, subject, &row.tenant).await? {
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

    /// `DELETE /v1/sessions/{id}` while it waits for review: the approval is withdrawn and the
    /// session closed (`deleted`). `None`: it was no longer waiting (decided meanwhile).
    pub(super) async fn withdraw_session(
        &self,
        caller: &ApiKey,
        row: &SessionRow,
    ) -> Result<Option<SessionRow>, AppError> {
        let subject = ApprovalSubject::Session(&row.id);
        let withdrawn = self.withdraw(caller, subject, &row.tenant).await?;
        if let Some(closed) = withdrawn.and_then(|withdrawn| withdrawn.session) {
            return Ok(Some(closed));
        }
        // Approved already, its sandbox still starting: closed now, the start finds it closed
        // and removes what it started.
        let reason = Reason {
            code: "session.deleted".to_owned(),
            message: format!(
                "deleted by {} ({}) while its approved sandbox was starting",
                caller.principal, caller.id
            ),
        };
        Ok(self
            .audit
            .close_unstarted_session(&row.id, crate::session_wire::ClosedReason::Deleted, &reason)
            .await?)
    }

    /// Withdraws the pending approval of `subject` at `caller`'s request (`approval.withdrawn`).
    /// `None`: nothing was pending.
    async fn withdraw(
        &self,
        caller: &ApiKey,
        subject: ApprovalSubject<'_>,
        tenant: &str,
    ) -> Result<Option<Withdrawn>, AppError> {
        let reason = Reason {
            code: "approval.withdrawn".to_owned(),
            message: format!(
                "withdrawn by {} ({}) before review",
                caller.principal, caller.id
            ),
        };
        let execution_id = match subject {
            ApprovalSubject::Execution(id) => Some(id.to_owned()),
            ApprovalSubject::Session(_) => None,
        };
        let event = NewEvent {
            kind: api_types::EventKind::ApprovalWithdrawn,
            execution_id,
            key_id: Some(caller.id.clone()),
            tenant: Some(tenant.to_owned()),
            decision_id: None,
            allow: Some(false),
            reasons: events::column(&[&reason]),
            // The store writes the input once it knows the approval withdrawn.
            input: Value::Object(serde_json::Map::new()),
            decision: events::column(&approval_events::Status {
                status: ApprovalStatus::Withdrawn,
            }),
            policy_revision: None,
        };
        Ok(self
            .audit
            .withdraw_approval(subject, &reason, &event)
            .await?)
    }
}

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

fn review_event(
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
        reasons: events::column(&[reason]),
        input: events::column(&approval_events::Reviewed {
            approval_id: approval.id.clone(),
            session_id: approval.session_id.clone(),
            reviewer: approval_events::Reviewer {
                key_id: caller.id.clone(),
                principal: caller.principal.clone(),
                role: caller.role,
            },
            requested_by: approval_events::Requester {
                key_id: approval.requester_key_id.clone(),
                principal: approval.requester_principal.clone(),
            },
            comment: comment.map(str::to_owned),
        }),
        decision: events::column(&approval_events::Verdict {
            status: status_of(approve),
            runnable: approval
                .runnable
                .as_ref()
                .map(|runnable| runnable.0.clone()),
        }),
        policy_revision: None,
    }
}

/// `session.denied` of a rejected session, naming the reviewer.
fn session_denied_event(
    reviewer: &ApiKey,
    approval: &ApprovalRow,
    session_id: &str,
    reason: &Reason,
) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::SessionDenied,
        execution_id: None,
        key_id: approval.requester_key_id.clone(),
        tenant: approval.tenant.clone(),
        decision_id: None,
        allow: Some(false),
        reasons: events::column(&[reason]),
        input: events::column(&session_events::Denial {
            session_id: session_id.to_owned(),
            approval_id: approval.id.clone(),
            reviewer: party(reviewer),
        }),
        decision: events::column(&session_events::Denied {
            status: ApprovalStatus::Rejected,
            closed_reason: crate::session_wire::ClosedReason::Denied,
        }),
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
