//! Sessions held for review (`POST /v1/sessions` answers 202 `pending_approval`).
//! The decision is committed with the pending session and its approval before the answer; no
//! sandbox exists while it waits, yet it counts against `max_sessions`. A reviewer's approval
//! (`POST /v1/approvals/{id}`, on any replica) starts the sandbox on the deciding replica with
//! the decision that was reviewed, and the session becomes `ready` (`session.created`, naming
//! the approval and the reviewer); its idle and lifetime clocks start then. A rejection closes
//! it (`denied`, `session.denied`), so do the approval's expiry (`expired`) and the agent's
//! `DELETE` while it waits (`deleted`, `approval.withdrawn`). A sandbox that cannot start closes
//! it (`start_failed`), the event saying why.

use std::sync::Arc;

use serde_json::json;
use sqlx::types::Json;

use policy_engine::{Decision, PolicyInput, Reason};

use super::approvals::{review_event, Review, ReviewDecision};
use super::floor::Runnable;
use super::reaper::LiveGuard;
use super::scheduler::Ticket;
use super::sessions::{release, Opened, SessionRequest, SessionShare};
use super::{error_chain, App, AppError};
use crate::audit::approvals::{ApprovalRow, Held, NewApproval};
use crate::audit::session_approvals::UNOWNED;
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, NewEvent};
use crate::runtime::SessionRunner;
use crate::session_wire::{ClosedReason, SessionStatus};

/// A session request the policy sent to review, decided and floor-checked.
pub(super) struct HeldSession<'a> {
    pub(super) id: &'a str,
    pub(super) request: &'a SessionRequest,
    pub(super) input: &'a PolicyInput,
    pub(super) decision: &'a Decision,
    /// The decision as the session row keeps it (`sessions::decision_record`).
    pub(super) recorded: &'a serde_json::Value,
    pub(super) runnable: &'a Runnable,
    /// The session's decision event, to be recorded as `approval.requested`.
    pub(super) event: NewEvent,
}

impl App {
    /// Commits the pending session, its approval (the runnable decision and what was asked)
    /// and `approval.requested` (with the policy input and decision) in one transaction.
    pub(super) async fn hold_session(
        self: &Arc<Self>,
        caller: &ApiKey,
        held: HeldSession<'_>,
    ) -> Result<Opened, AppError> {
        let (idle, ttl) = self.session_lifetimes(held.request);
        let now = crate::ids::now_micros();
        let approval_ttl = chrono::Duration::seconds(
            i64::try_from(self.config.approval_ttl_s).unwrap_or(i64::MAX / 1000),
        );
        let mut summary = json!(held.input.request);
        summary["idle_timeout_s"] = json!(idle);
        summary["ttl_s"] = json!(ttl);
        let stored = json!({"language": held.request.language, "session": held.id});
        let approval = NewApproval {
            id: crate::ids::new("ap"),
            expires_at: now + approval_ttl,
            requester_key_id: caller.id.clone(),
            requester_principal: caller.principal.clone(),
            reasons: held.decision.reasons.clone(),
            runnable: serde_json::to_value(held.runnable)
                .map_err(|err| AppError::Internal(format!("runnable decision: {err}")))?,
            summary,
            request_bytes: i64::try_from(stored.to_string().len()).unwrap_or(i64::MAX),
            request: stored,
        };
        let row = pending_row(caller, &held, &approval, (idle, ttl), now);
        let mut event = held.event;
        event.input = json!({
            "approval_id": approval.id,
            "session_id": held.id,
            "requested_by": {"key_id": caller.id, "principal": caller.principal},
            "request": held.input,
        });
        // `require_approval` at the top, so `v_decisions` counts it as a review outcome.
        event.decision = json!({
            "status": "pending",
            "expires_at": approval.expires_at,
            "require_approval": true,
            "policy": event.decision,
        });
        let caps = self.pending_caps();
        let stored = self
            .audit
            .record_pending_session(
                &row,
                &approval,
                std::slice::from_ref(&event),
                (&caps, self.config.max_sessions),
            )
            .await?
            .map_err(|full| AppError::RateLimited(format!("{full}; close one first")))?;
        if let Held::Full(why) = stored {
            let reason = Reason {
                code: "approval.pending_limit".to_owned(),
                message: why.clone(),
            };
            event.kind = api_types::EventKind::SessionDenied;
            event.allow = Some(false);
            event.reasons = json!([reason]);
            self.audit.record_event(&event).await?;
            return Err(AppError::RateLimited(why));
        }
        tracing::info!(session_id = %row.id, approval_id = %approval.id, "session held for review");
        Ok(Opened::PendingApproval(row))
    }

    /// Decides a session's approval (the checks common to both subjects are done). Approved:
    /// its sandbox is started here and the answer is the session as it then is (`ready`, or
    /// `closed` with `start_failed`). Rejected: `closed` (`denied`).
    pub(super) async fn decide_session_approval(
        self: &Arc<Self>,
        caller: &ApiKey,
        approval: &ApprovalRow,
        review: &Review,
    ) -> Result<(ApprovalRow, SessionRow), AppError> {
        let id = &approval.id;
        let session_id = approval
            .session_id
            .clone()
            .ok_or_else(|| AppError::Internal(format!("approval {id} has no session")))?;
        let approve = review.decision == ReviewDecision::Approve;
        let comment = review.comment.as_deref().filter(|c| !c.is_empty());
        let admitted = if approve {
            Some(self.admit_approved(approval, &session_id)?)
        } else {
            None
        };
        let verdict = self.verdict(caller, approve, comment);
        let reason = &verdict.reason;
        let mut events = vec![review_event(caller, approval, approve, comment, reason)];
        if !approve {
            events.push(denied_event(caller, approval, &session_id, reason));
        }
        let decided = self
            .audit
            .decide_session_approval(id, &verdict, &events)
            .await?;
        let Some(row) = decided else {
            return Err(AppError::Conflict(format!(
                "approval {id} is no longer pending (decided, expired or withdrawn meanwhile)"
            )));
        };
        tracing::info!(approval_id = %id, session_id = %session_id, approve, "session approval decided");
        let row = match admitted {
            Some(admitted) => {
                // Its own task: a reviewer whose connection goes away does not leave the
                // session approved but never started (it opens, or closes `start_failed`).
                let app = Arc::clone(self);
                let (reviewer, approval) = (caller.clone(), approval.clone());
                self.tasks
                    .spawn(
                        async move { app.open_approved(&reviewer, &approval, row, admitted).await },
                    )
                    .await
                    .map_err(|err| {
                        AppError::Internal(format!("opening the approved session failed: {err}"))
                    })??
            }
            None => row,
        };
        let approval = self
            .audit
            .get_approval(id)
            .await?
            .ok_or(AppError::NotFound)?;
        Ok((approval, row))
    }

    /// What approving needs before it commits: the reviewed decision (still runnable here), a
    /// queue ticket (a full queue refuses, 429, with the approval still pending) and a live
    /// entry (the lease is renewed from the commit on).
    fn admit_approved(
        self: &Arc<Self>,
        approval: &ApprovalRow,
        session_id: &str,
    ) -> Result<(Runnable, Ticket, LiveGuard, SessionShare), AppError> {
        let runnable = self.reviewed_runnable(approval)?;
        let tenant = approval.tenant.clone().unwrap_or_default();
        let share = self.session_share()?;
        let ticket = self
            .scheduler
            .admit(&tenant)
            .map_err(|full| AppError::RateLimited(full.to_string()))?;
        let live = self.live.try_track(session_id).ok_or_else(|| {
            AppError::Conflict(format!(
                "approval {} is being decided by another request",
                approval.id
            ))
        })?;
        Ok((runnable, ticket, live, share))
    }

    /// Starts an approved session's sandbox with the reviewed decision and marks it `ready`;
    /// when that fails it is closed (`start_failed`) and the answer says so.
    async fn open_approved(
        self: &Arc<Self>,
        reviewer: &ApiKey,
        approval: &ApprovalRow,
        row: SessionRow,
        (runnable, ticket, live, share): (Runnable, Ticket, LiveGuard, SessionShare),
    ) -> Result<SessionRow, AppError> {
        let started = async {
            let runner = SessionRunner::for_language(&row.language).ok_or_else(|| {
                AppError::Internal(format!("language {:?} has no session runner", row.language))
            })?;
            let slot = ticket
                .slot()
                .await
                .ok_or_else(|| AppError::Internal("the gateway is shutting down".into()))?;
            let (id, tenant, language) = (&row.id, &row.tenant, &row.language);
            self.start_session(id, tenant, runner, language, runnable, (slot, live, share))
                .await
        };
        let held = match started.await {
            Ok(held) => held,
            Err(err) => return self.start_failed(&row.id, &err).await,
        };
        let event = created_event(reviewer, approval, &row);
        let marked = self
            .audit
            .session_started(&row.id, &self.instance, held.sandbox.name(), &event)
            .await;
        match marked {
            Ok(Some(ready)) => {
                let lifetimes = (
                    u64::try_from(ready.idle_timeout_s).unwrap_or(1),
                    u64::try_from(ready.ttl_s).unwrap_or(1),
                );
                self.keep_open(ready.id.clone(), held, lifetimes);
                Ok(ready)
            }
            Ok(None) => {
                // Closed meanwhile (its lease was taken as lapsed): it must not run.
                release(held).await;
                self.audit
                    .get_session(&row.id)
                    .await?
                    .ok_or(AppError::NotFound)
            }
            Err(err) => {
                release(held).await;
                self.start_failed(&row.id, &AppError::from(err)).await
            }
        }
    }

    /// Closes an approved session that could not start (`start_failed`, the event says why).
    async fn start_failed(&self, id: &str, err: &AppError) -> Result<SessionRow, AppError> {
        let why = Reason {
            code: "session.start_failed".to_owned(),
            message: format!("the approved session could not start: {}", error_chain(err)),
        };
        tracing::error!(session_id = %id, error = %why.message, "approved session not started");
        match self
            .audit
            .close_unstarted_session(id, ClosedReason::StartFailed, &why)
            .await?
        {
            Some(row) => Ok(row),
            None => self.audit.get_session(id).await?.ok_or(AppError::NotFound),
        }
    }

    /// `DELETE /v1/sessions/{id}` while it waits for review: the approval is withdrawn and the
    /// session closed (`deleted`). `None`: it was no longer waiting (decided meanwhile).
    pub(super) async fn withdraw_session(
        &self,
        caller: &ApiKey,
        row: &SessionRow,
    ) -> Result<Option<SessionRow>, AppError> {
        let reason = Reason {
            code: "approval.withdrawn".to_owned(),
            message: format!(
                "withdrawn by {} ({}) before review",
                caller.principal, caller.id
            ),
        };
        let event = NewEvent {
            kind: api_types::EventKind::ApprovalWithdrawn,
            execution_id: None,
            key_id: Some(caller.id.clone()),
            tenant: Some(row.tenant.clone()),
            decision_id: None,
            allow: Some(false),
            reasons: json!([reason]),
            input: json!({}),
            decision: json!({"status": "withdrawn"}),
            policy_revision: None,
        };
        if let Some(closed) = self
            .audit
            .withdraw_session_approval(&row.id, &reason, &event)
            .await?
        {
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
            .close_unstarted_session(&row.id, ClosedReason::Deleted, &reason)
            .await?)
    }
}

/// The session row as held: no replica, no container; it expires with its approval.
fn pending_row(
    caller: &ApiKey,
    held: &HeldSession<'_>,
    approval: &NewApproval,
    (idle, ttl): (u64, u64),
    now: chrono::DateTime<chrono::Utc>,
) -> SessionRow {
    SessionRow {
        id: held.id.to_owned(),
        tenant: caller.tenant.clone(),
        key_id: caller.id.clone(),
        language: held.request.language.clone(),
        status: SessionStatus::PendingApproval,
        closed_reason: None,
        decision: Json(held.recorded.clone()),
        limits: Json(json!(held.runnable.limits)),
        idle_timeout_s: i64::try_from(idle).unwrap_or(i64::MAX),
        ttl_s: i64::try_from(ttl).unwrap_or(i64::MAX),
        executions: 0,
        instance: UNOWNED.to_owned(),
        container: None,
        created_at: now,
        last_used_at: now,
        expires_at: approval.expires_at,
        closed_at: None,
        approval_id: Some(approval.id.clone()),
        start: None,
    }
}

/// `session.created` of an approved session: the agent's, naming the approval and reviewer.
fn created_event(reviewer: &ApiKey, approval: &ApprovalRow, row: &SessionRow) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::SessionCreated,
        execution_id: None,
        key_id: Some(row.key_id.clone()),
        tenant: Some(row.tenant.clone()),
        decision_id: None,
        allow: Some(true),
        reasons: json!(approval.reasons.0),
        input: json!({
            "session_id": row.id,
            "approval_id": approval.id,
            "reviewer": {"key_id": reviewer.id, "principal": reviewer.principal},
        }),
        decision: row.decision.0.clone(),
        policy_revision: None,
    }
}

/// `session.denied` of a rejected session, naming the reviewer.
fn denied_event(
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
        reasons: json!([reason]),
        input: json!({
            "session_id": session_id,
            "approval_id": approval.id,
            "reviewer": {"key_id": reviewer.id, "principal": reviewer.principal},
        }),
        decision: json!({"status": "rejected", "closed_reason": "denied"}),
        policy_revision: None,
    }
}
