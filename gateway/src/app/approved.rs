//! What runs once a reviewer approves (`approvals.rs`): the subject, exactly as reviewed, never
//! decided again. An execution runs its stored decision and program through the normal queue.
//! A session's sandbox is started on the deciding replica and the session becomes `ready`
//! (`session.created`, naming the approval and the reviewer); its idle and lifetime clocks
//! start then. A sandbox that cannot start closes it (`start_failed`), the event saying why.

use std::sync::Arc;

use policy_engine::Reason;

use super::approvals::Reviewed;
use super::floor::Runnable;
use super::launch::{Launch, Program};
use super::reaper::LiveGuard;
use super::scheduler::Ticket;
use super::sessions::{release, Held, SessionShare, StartsIn};
use super::snapshots::{Places, Whose};
use super::subjects::StoredRequest;
use super::validate::decode_files;
use super::{error_chain, App, AppError};
use crate::audit::approvals::{ApprovalRow, ApprovalSubject, Decided};
use crate::audit::events::{
    self,
    approvals::Party,
    sessions::{ApprovedOpen, ForkSource},
};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, ExecutionRow, NewEvent};
use crate::runtime::SessionRunner;
use crate::session_wire::ClosedReason;

/// What approving takes before it commits: the reviewed decision (still runnable here), a
/// place in the queue (a full queue refuses, 429, with the approval still pending) and a live
/// entry (the reaper never closes the subject between the commit and its start); a session
/// also its place in the sessions' share.
pub(super) enum Admission {
    Execution(Runnable, Ticket, LiveGuard),
    Session(Runnable, Ticket, LiveGuard, SessionShare),
}

impl App {
    pub(super) fn admit_approved(
        &self,
        approval: &ApprovalRow,
        subject: ApprovalSubject<'_>,
    ) -> Result<Admission, AppError> {
        let runnable = self.reviewed_runnable(approval)?;
        let (id, share) = match subject {
            ApprovalSubject::Execution(id) => (id, None),
            ApprovalSubject::Session(id) => (id, Some(self.session_share()?)),
        };
        let tenant = approval.tenant.clone().unwrap_or_default();
        let ticket = self
            .scheduler
            .admit(&tenant)
            .map_err(|full| AppError::RateLimited(full.to_string()))?;
        let live = self.live.try_track(id).ok_or_else(|| {
            AppError::Conflict(format!(
                "approval {} is being decided by another request",
                approval.id
            ))
        })?;
        Ok(match share {
            None => Admission::Execution(runnable, ticket, live),
            Some(share) => Admission::Session(runnable, ticket, live, share),
        })
    }

    /// Acts on a committed review (in the review's own task, `approvals.rs`): an approved
    /// execution is launched, an approved session opened. Answers the approval and its subject
    /// as they then are.
    pub(super) async fn act_on_review(
        self: &Arc<Self>,
        reviewer: &ApiKey,
        approval: &ApprovalRow,
        decided: Decided,
        admitted: Option<Admission>,
    ) -> Result<(ApprovalRow, Reviewed), AppError> {
        if let Some(session) = decided.session {
            // A held fork (`from_snapshot`) starts from its snapshot, as an admitted one does.
            let fork = decided
                .request
                .as_ref()
                .and_then(|request| request.get("from_snapshot"))
                .and_then(serde_json::Value::as_str);
            let row = match admitted {
                Some(Admission::Session(runnable, ticket, live, share)) => {
                    let admitted = (runnable, ticket, live, share);
                    self.open_approved(reviewer, approval, (session, fork), admitted)
                        .await?
                }
                _ => session,
            };
            let approval = self
                .audit
                .get_approval(&approval.id)
                .await?
                .ok_or(AppError::NotFound)?;
            return Ok((approval, Reviewed::Session(Box::new(row))));
        }
        let execution_id = approval.execution_id.as_deref().unwrap_or_default();
        let row = self
            .audit
            .get_execution(execution_id)
            .await?
            .ok_or(AppError::NotFound)?;
        if let Some(Admission::Execution(runnable, ticket, live)) = admitted {
            self.launch_approved(row.clone(), &decided, runnable, (ticket, live))?;
        }
        Ok((decided.approval, Reviewed::Execution(Box::new(row))))
    }

    /// Starts an approved execution with the decision and program that were reviewed.
    fn launch_approved(
        self: &Arc<Self>,
        row: ExecutionRow,
        decided: &Decided,
        runnable: Runnable,
        (ticket, live): (Ticket, LiveGuard),
    ) -> Result<(), AppError> {
        let broken = |what: &str, err: &dyn std::fmt::Display| {
            // The row stays `queued` without a live run: the reaper closes it as `error`.
            AppError::Internal(format!("approved execution {}: {what}: {err}", row.id))
        };
        let stored: StoredRequest = decided
            .request
            .clone()
            .ok_or_else(|| broken("request", &"missing"))
            .and_then(|v| serde_json::from_value(v).map_err(|err| broken("request", &err)))?;
        let files = decode_files(&stored.files)?;
        let program = Program {
            language: stored.language,
            code: stored.code,
            files,
        };
        self.launch(Launch {
            row,
            program,
            runnable,
            live,
            ticket,
        });
        Ok(())
    }

    /// Starts an approved session's sandbox with the reviewed decision and marks it `ready`;
    /// when that fails it is closed (`start_failed`) and the answer says so.
    async fn open_approved(
        self: &Arc<Self>,
        reviewer: &ApiKey,
        approval: &ApprovalRow,
        (row, fork): (SessionRow, Option<&str>),
        (runnable, ticket, live, share): (Runnable, Ticket, LiveGuard, SessionShare),
    ) -> Result<SessionRow, AppError> {
        let started = async {
            let slot = ticket
                .slot()
                .await
                .ok_or_else(|| AppError::Internal("the gateway is shutting down".into()))?;
            let places = (slot, live, share);
            match fork {
                Some(snapshot) => {
                    self.start_approved_fork(&row, snapshot, runnable, places)
                        .await
                }
                None => Ok((
                    self.start_approved_session(&row, runnable, places).await?,
                    None,
                )),
            }
        };
        let (held, from_snapshot) = match started.await {
            Ok(started) => started,
            Err(err) => return self.start_failed(&row.id, &err).await,
        };
        let event = created_event(reviewer, approval, &row, from_snapshot);
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

    /// A fresh sandbox for an approved session.
    async fn start_approved_session(
        &self,
        row: &SessionRow,
        runnable: Runnable,
        places: Places,
    ) -> Result<Held, AppError> {
        let runner = SessionRunner::for_language(&row.language).ok_or_else(|| {
            AppError::Internal(format!("language {:?} has no session runner", row.language))
        })?;
        // A held E2B create has its E2B row already (`e2b/control.rs`): E2B's home.
        let starts_in = match self.audit.e2b_sandbox(&row.id).await? {
            Some(_) => StartsIn::UserHome,
            None => StartsIn::Workspace,
        };
        let (id, tenant, language) = (&row.id, &row.tenant, &row.language);
        self.start_session(id, tenant, (runner, starts_in), language, runnable, places)
            .await
    }

    /// An approved fork, restored from its snapshot under the reviewed decision's grant. The
    /// snapshot must still be kept (deleted or expired while the session waited: it does not
    /// start) and be of the session's tenant. With the snapshot as `session.created` names it.
    async fn start_approved_fork(
        &self,
        row: &SessionRow,
        snapshot_id: &str,
        runnable: Runnable,
        places: Places,
    ) -> Result<(Held, Option<ForkSource>), AppError> {
        let snapshot = self
            .audit
            .get_snapshot(snapshot_id)
            .await?
            .filter(|snapshot| snapshot.tenant == row.tenant)
            .ok_or_else(|| {
                AppError::Conflict(format!(
                    "snapshot {snapshot_id} was deleted or expired while the session waited \
                     for review"
                ))
            })?;
        let whose = Whose {
            id: &row.id,
            tenant: &row.tenant,
            key_id: &row.key_id,
        };
        let held = self.start_fork(whose, &snapshot, runnable, places).await?;
        let named = ForkSource {
            id: snapshot.id.clone(),
            session_id: snapshot.session_id.clone(),
            sha256: snapshot.sha256.clone(),
        };
        Ok((held, Some(named)))
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
}

/// `session.created` of an approved session: the agent's, naming the approval and reviewer,
/// and for a fork the snapshot it was restored from (id, and the sha256 its image was checked
/// against).
fn created_event(
    reviewer: &ApiKey,
    approval: &ApprovalRow,
    row: &SessionRow,
    from_snapshot: Option<ForkSource>,
) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::SessionCreated,
        execution_id: None,
        key_id: Some(row.key_id.clone()),
        tenant: Some(row.tenant.clone()),
        decision_id: None,
        allow: Some(true),
        reasons: events::column(&approval.reasons.0),
        input: events::column(&ApprovedOpen {
            session_id: row.id.clone(),
            approval_id: approval.id.clone(),
            reviewer: Party {
                key_id: reviewer.id.clone(),
                principal: reviewer.principal.clone(),
            },
            from_snapshot,
        }),
        decision: row.decision.0.clone(),
        policy_revision: None,
    }
}
