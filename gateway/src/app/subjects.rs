//! What each subject of the pipeline (`pipeline.rs`) is recorded as, and how its denial and its
//! hold for review are committed:
//! - an execution, alone or in a session: its row and its `execution.decision` event; denied, the
//!   row ends `denied`; held, it is `pending_approval` with its approval and `approval.requested`;
//! - a session: its decision as the row keeps it and its decision event; denied,
//!   `session.denied`; held, a `pending_approval` session row with its approval, the decision
//!   event recorded as `approval.requested`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::types::Json;

use policy_engine::{Decision, Reason};

use super::approvals::Hold;
use super::floor::Runnable;
use super::overflow::Refusal;
use super::pipeline::{Ask, Decided, Record, Subject, Verdict};
use super::request::FileUpload;
use super::sessions::SessionRequest;
use super::{App, AppError};
use crate::audit::approvals::{Held, NewApproval, Pending, UNOWNED};
use crate::audit::events::{self, approvals, sessions as session_events};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, ExecutionRow, NewEvent};
use crate::session_wire::SessionStatus;
use crate::status::ExecutionStatus;

/// An execution (alone or in a session) as decided: its row and its `execution.decision` event.
#[derive(Debug)]
pub(super) struct ExecutionRecord {
    pub(super) row: ExecutionRow,
    pub(super) event: NewEvent,
}

/// What is kept of a held execution to run it later: the parts not in the policy input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredRequest {
    pub(super) language: String,
    pub(super) code: String,
    pub(super) files: Vec<FileUpload>,
}

impl Record for ExecutionRecord {
    /// The `pending_approval` row and its approval's id.
    type Held = (ExecutionRow, String);

    fn new(app: &App, ask: &Ask<'_>, decided: &Decided) -> Self {
        let mut row = execution_row(ask, decided, &app.instance);
        if let Subject::SessionExecution(session) = &ask.subject {
            row.session_id = Some(session.row.id.clone());
        }
        // The row keeps what the gateway did with the decision; the event also what the policy
        // said (replay compares against it).
        let event = NewEvent {
            kind: api_types::EventKind::ExecutionDecision,
            execution_id: Some(row.id.clone()),
            key_id: Some(ask.caller.id.clone()),
            tenant: Some(ask.caller.tenant.clone()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(!matches!(decided.verdict, Verdict::Denied)),
            reasons: events::column(&decided.decision.reasons),
            input: events::column(&decided.input),
            decision: events::column(&decided.said),
            policy_revision: Some(row.policy_revision.clone()),
        };
        ExecutionRecord { row, event }
    }

    async fn deny(&self, app: &App) -> Result<(), AppError> {
        app.audit
            .record_execution_decision(&self.row, &self.event)
            .await?;
        tracing::info!(execution_id = %self.row.id, allow = false, "decision recorded");
        Ok(())
    }

    /// The row (`pending_approval`), its approval (with the runnable decision and the
    /// payload), the decision event and `approval.requested`, in one transaction. A cap on
    /// what may wait records the request as refused (429, `overflow.rs`).
    async fn hold(
        self,
        app: &Arc<App>,
        ask: &Ask<'_>,
        decided: &Decided,
        runnable: &Runnable,
    ) -> Result<Self::Held, AppError> {
        let ExecutionRecord { mut row, event } = self;
        row.status = ExecutionStatus::PendingApproval;
        let approval = app.new_approval(Hold {
            caller: ask.caller,
            asked_at: row.created_at,
            reasons: row.reasons.0.clone(),
            runnable,
            summary: json!(decided.input.request),
            stored: json!(StoredRequest {
                language: ask.request.language.clone(),
                code: ask.request.code.clone(),
                files: ask.request.files.clone(),
            }),
        })?;
        let requested = NewEvent {
            kind: api_types::EventKind::ApprovalRequested,
            execution_id: Some(row.id.clone()),
            key_id: Some(ask.caller.id.clone()),
            tenant: Some(ask.caller.tenant.clone()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(true),
            reasons: events::column(&row.reasons.0),
            input: events::column(&approvals::ExecutionRequested {
                approval_id: approval.id.clone(),
                requested_by: party(ask.caller),
            }),
            decision: events::column(&approvals::Pending {
                status: api_types::ApprovalStatus::Pending,
                expires_at: approval.expires_at,
            }),
            policy_revision: Some(row.policy_revision.clone()),
        };
        let events = [event, requested];
        let pending = Pending::Execution(&row);
        match app.commit_hold(pending, &approval, &events).await? {
            Held::Held => {}
            Held::Full(why) => {
                let [event, _] = events;
                let refusal = Refusal::PendingApprovalLimit;
                return Err(app.refuse_after_decision((row, event), refusal, why).await);
            }
            Held::SessionsFull(full) => return Err(AppError::RateLimited(full.to_string())),
            Held::KeyNotLive => return Err(key_not_live()),
        }
        tracing::info!(execution_id = %row.id, approval_id = %approval.id, "held for review");
        Ok((row, approval.id.into()))
    }
}

/// An execution's row as decided: `queued` when it may run (now or once approved), `denied`
/// (and finished) otherwise.
fn execution_row(ask: &Ask<'_>, decided: &Decided, instance: &str) -> ExecutionRow {
    let (caller, request) = (ask.caller, ask.request);
    let runnable = decided.verdict.runnable();
    let now = crate::ids::now_micros();
    ExecutionRow {
        id: crate::ids::new("ex"),
        tenant: caller.tenant.clone(),
        key_id: caller.id.clone(),
        language: request.language.clone(),
        code_sha256: decided.input.request.code_sha256.clone(),
        code_bytes: i64::try_from(request.code.len()).unwrap_or(i64::MAX),
        labels: Json(json!(request.labels)),
        status: if runnable.is_some() {
            ExecutionStatus::Queued
        } else {
            ExecutionStatus::Denied
        },
        decision_id: decided.id.clone(),
        allow: decided.decision.allow,
        reasons: Json(decided.decision.reasons.clone()),
        backend: runnable.map(|r| r.backend.clone()),
        runtime: runnable.map(|r| r.runtime.clone()),
        image: runnable.map(|r| r.image.clone()),
        limits: runnable.map(|r| Json(r.limits.clone())),
        policy_revision: decided.revision.clone(),
        created_at: now,
        started_at: None,
        finished_at: runnable.is_none().then_some(now),
        exit_code: None,
        duration_ms: None,
        stdout: None,
        stderr: None,
        stdout_truncated: false,
        stderr_truncated: false,
        outputs: Json(json!([])),
        error: None,
        instance: Some(instance.to_owned()),
        outputs_skipped: Json(json!([])),
        outputs_truncated: false,
        purged_at: None,
        start: None,
        container: None,
        session_id: None,
        result: None,
        results: None,
        resumed: false,
    }
}

/// A session opening as decided: its id, its decision (as answered when denied, and as the row
/// keeps it) and its decision event, whose kind says what became of it.
#[derive(Debug)]
pub(super) struct SessionRecord {
    pub(super) id: String,
    pub(super) decision: Decision,
    /// The decision as the session row keeps it (`decision_record`).
    pub(super) recorded: serde_json::Value,
    event: NewEvent,
}

impl SessionRecord {
    /// The session's decision event as `kind` (`session.created`, `session.denied`, ...).
    pub(super) fn event(&self, kind: api_types::EventKind) -> NewEvent {
        NewEvent {
            kind,
            ..self.event.clone()
        }
    }
}

impl Record for SessionRecord {
    /// The `pending_approval` session row, naming its approval.
    type Held = SessionRow;

    fn new(_app: &App, ask: &Ask<'_>, decided: &Decided) -> Self {
        let id = crate::ids::new("ss");
        let event = NewEvent {
            kind: api_types::EventKind::SessionCreated,
            execution_id: None,
            key_id: Some(ask.caller.id.clone()),
            tenant: Some(ask.caller.tenant.clone()),
            decision_id: Some(decided.id.clone()),
            allow: Some(decided.decision.allow),
            reasons: events::column(&decided.decision.reasons),
            input: events::column(&session_events::Opened {
                session_id: id.clone(),
                request: decided.input.clone(),
            }),
            decision: events::column(&decided.said),
            policy_revision: Some(decided.revision.clone()),
        };
        SessionRecord {
            recorded: decision_record(&decided.id, &decided.revision, &decided.decision),
            decision: decided.decision.clone(),
            id,
            event,
        }
    }

    async fn deny(&self, app: &App) -> Result<(), AppError> {
        let denied = self.event(api_types::EventKind::SessionDenied);
        app.audit.record_event(&denied).await?;
        Ok(())
    }

    /// The pending session (no sandbox, yet counted against `max_sessions`), its approval (the
    /// runnable decision and what was asked) and `approval.requested` (with the policy input
    /// and decision), in one transaction. A cap on what may wait records `session.denied`.
    async fn hold(
        self,
        app: &Arc<App>,
        ask: &Ask<'_>,
        decided: &Decided,
        runnable: &Runnable,
    ) -> Result<Self::Held, AppError> {
        let Subject::Session(request) = &ask.subject else {
            return Err(AppError::Internal(
                "a session held without its request".into(),
            ));
        };
        let lifetimes = app.session_lifetimes(request);
        let now = crate::ids::now_micros();
        let mut summary = json!(decided.input.request);
        summary["idle_timeout_s"] = json!(lifetimes.0);
        summary["ttl_s"] = json!(lifetimes.1);
        let approval = app.new_approval(Hold {
            caller: ask.caller,
            asked_at: now,
            reasons: decided.decision.reasons.clone(),
            runnable,
            summary,
            // A fork starts from its snapshot once approved (`approved.rs`).
            stored: json!({"language": request.language, "session": self.id,
                "from_snapshot": request.from_snapshot}),
        })?;
        let held = (runnable, &approval);
        let row = pending_row(ask.caller, &self, request, held, (lifetimes, now));
        let mut event = self.event(api_types::EventKind::ApprovalRequested);
        event.input = events::column(&approvals::SessionRequested {
            approval_id: approval.id.clone(),
            session_id: self.id.clone(),
            requested_by: party(ask.caller),
            request: decided.input.clone(),
        });
        // `require_approval` at the top, so `v_decisions` counts it as a review outcome.
        event.decision = events::column(&approvals::SessionPending {
            status: api_types::ApprovalStatus::Pending,
            expires_at: approval.expires_at,
            require_approval: true,
            policy: decided.said.clone(),
        });
        let pending = Pending::Session {
            row: &row,
            max_sessions: app.config.max_sessions,
        };
        match app
            .commit_hold(pending, &approval, std::slice::from_ref(&event))
            .await?
        {
            Held::Held => {}
            Held::SessionsFull(full) => {
                return Err(AppError::RateLimited(format!("{full}; close one first")))
            }
            Held::Full(why) => return Err(refuse_held_session(app, event, why).await),
            Held::KeyNotLive => return Err(key_not_live()),
        }
        tracing::info!(session_id = %row.id, approval_id = %approval.id, "session held for review");
        Ok(row)
    }
}

/// The caller's key was revoked (or expired) while its request was read: nothing is held.
fn key_not_live() -> AppError {
    AppError::Forbidden("this key was revoked or expired before the request could be held".into())
}

/// A session the pending caps refuse to hold: `session.denied` (its decision event, naming the
/// cap), and 429.
async fn refuse_held_session(app: &App, mut event: NewEvent, why: String) -> AppError {
    let reason = Reason {
        code: Refusal::PendingApprovalLimit.code().to_owned(),
        message: why.clone(),
    };
    event.kind = api_types::EventKind::SessionDenied;
    event.allow = Some(false);
    event.reasons = events::column(&[reason]);
    match app.audit.record_event(&event).await {
        Ok(_) => AppError::RateLimited(why),
        Err(err) => err.into(),
    }
}

/// The session row as held: no replica, no container; it expires with its approval.
fn pending_row(
    caller: &ApiKey,
    record: &SessionRecord,
    request: &SessionRequest,
    (runnable, approval): (&Runnable, &NewApproval),
    ((idle, ttl), now): ((u64, u64), chrono::DateTime<chrono::Utc>),
) -> SessionRow {
    SessionRow {
        id: record.id.clone(),
        tenant: caller.tenant.clone(),
        key_id: caller.id.clone(),
        language: request.language.clone(),
        status: SessionStatus::PendingApproval,
        closed_reason: None,
        decision: Json(record.recorded.clone()),
        limits: Json(json!(runnable.limits)),
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

/// The session's decision as stored and shown: the decision (floor applied) with the `id` and
/// `policy_revision` an execution's decision carries (DESIGN 10: a session carries its
/// decision like an execution), so one names it in the audit log (`decision_id` of its
/// `session.created` or `approval.requested` event).
fn decision_record(id: &str, revision: &str, decision: &Decision) -> serde_json::Value {
    let mut recorded = json!(decision);
    recorded["id"] = json!(id);
    recorded["policy_revision"] = json!(revision);
    recorded
}

/// The caller as an event names who asked.
fn party(caller: &ApiKey) -> approvals::Party {
    approvals::Party {
        key_id: caller.id.clone(),
        principal: caller.principal.clone(),
    }
}
