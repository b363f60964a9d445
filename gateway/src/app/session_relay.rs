//! Sessions on every replica. A session's sandbox lives on one replica (its
//! `instance`); a request for it that reaches another replica is relayed to that one through
//! PostgreSQL: a `session_turns` row and a [`TURN`] notification. The owner claims the row and
//! runs the request exactly as if it had been asked itself (the same
//! `create_session_execution` / `delete_session`, for the same key, looked up again), so the
//! **owner decides**: the decision and the execution record are committed there, before the
//! turn runs, and name the owner as the `instance` that ran it. It writes the answer into the
//! row and says so ([`TURN_NEWS`]); the asker reads it back. Live events and cancel of the
//! relayed execution then take the executions' own relays (`app::replicas`).
//!
//! Bounds: the owner must claim the request within [`PICK_UP_WITHIN`] (else the asker marks it
//! abandoned, which the owner can no longer claim, and answers 503); a claimed request is
//! waited for at most the longest execution timeout plus [`ANSWER_MARGIN`]. A lost
//! notification costs latency only: the asker re-reads the row every [`POLL`], the owner looks
//! for waiting rows at every lease renewal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

use super::sessions::SessionExecutionRequest;
use super::{App, AppError};
use crate::audit::session_turns::{NewTurn, TurnAnswer, TurnErrorCode, TurnKind, TurnRow};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, ExecutionRow};
use crate::session_wire::{ClosedReason, SessionStatus};

/// "A request for a session you hold waits in `session_turns`".
pub const TURN: &str = "sandgate_turn";
/// "The request you relayed was claimed or answered".
pub const TURN_NEWS: &str = "sandgate_turn_news";
/// How long the owner has to claim a relayed request.
pub const PICK_UP_WITHIN: Duration = Duration::from_secs(5);
/// How long past the longest execution timeout a claimed request is waited for.
const ANSWER_MARGIN: Duration = Duration::from_secs(60);
/// How long a picked turn waits for its answer once its session closed some other way than
/// by a lapsed lease.
const CLOSED_GRACE: Duration = Duration::from_secs(5);
/// How often the asker re-reads the row without a notification.
const POLL: Duration = Duration::from_millis(500);

/// What the owner did for a relayed request.
enum Answered {
    Nothing,
    Execution(String),
    Snapshot(String),
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct TurnMessage {
    turn: String,
    /// The owner (on [`TURN`]) or the asker (on [`TURN_NEWS`]).
    to: String,
}

/// The requests this replica relayed and waits on, woken by [`TURN_NEWS`].
#[derive(Debug, Default)]
pub struct Waiting {
    turns: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, turn: &str) -> Arc<Notify> {
        Arc::clone(self.lock().entry(turn.to_owned()).or_default())
    }

    fn forget(&self, turn: &str) {
        self.lock().remove(turn);
    }

    fn wake(&self, turn: &str) {
        if let Some(notify) = self.lock().get(turn) {
            notify.notify_one();
        }
    }
}

impl App {
    /// The session's row when its sandbox is open on another replica (then its requests are
    /// relayed there); `None` when this replica answers itself (it holds it, or it is closed).
    pub(super) async fn session_held_elsewhere(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<Option<SessionRow>, AppError> {
        // Paused here: no sandbox held, its checkpoint in memory.
        let registered_paused = match self.sessions.get(id) {
            Some(open) => {
                open.held.try_lock().is_ok_and(|held| held.is_none())
                    && self.sessions.paused.inspected(id).is_some()
            }
            None => false,
        };
        if self.sessions.get(id).is_some() && !registered_paused {
            return Ok(None);
        }
        let row = self.get_session(caller, id).await?;
        if registered_paused {
            if row.instance == self.instance || row.is(SessionStatus::Closed) {
                return Ok(None);
            }
            // Paused here in memory, but another replica restored or adopted it since (its
            // `MOVED` lost, or a takeover here never claimed): that replica serves it.
            self.let_go(id);
        }
        // A session waiting for review is held by no replica (its instance is empty): every
        // replica answers it the same way (409 naming the approval).
        let elsewhere = !row.is(SessionStatus::Closed)
            && !row.is(SessionStatus::PendingApproval)
            && row.instance != self.instance;
        Ok(elsewhere.then_some(row))
    }

    /// `POST /v1/sessions/{id}/executions` for a session another replica holds.
    pub(super) async fn relay_session_execution(
        &self,
        caller: &ApiKey,
        session: &SessionRow,
        request: SessionExecutionRequest,
    ) -> Result<ExecutionRow, AppError> {
        let early = request.wait == Some(false);
        let body = serde_json::to_value(&request)
            .map_err(|err| AppError::Internal(format!("relaying a session execution: {err}")))?;
        let answer = self.relay(caller, session, TurnKind::Execute, body).await?;
        let execution = answer.execution_id.ok_or_else(|| {
            AppError::Internal(format!(
                "replica {} answered without a record",
                session.instance
            ))
        })?;
        let mut row = self.get_execution(caller, &execution).await?;
        if early && row.finished_at.is_none() && row.allow {
            // As the owner answers `wait: false`: the turn has started.
            row.status = crate::status::ExecutionStatus::Running;
        }
        Ok(row)
    }

    /// `DELETE /v1/sessions/{id}` for a session another replica holds.
    pub(super) async fn relay_session_close(
        &self,
        caller: &ApiKey,
        session: &SessionRow,
    ) -> Result<SessionRow, AppError> {
        self.relay(caller, session, TurnKind::Close, json!({}))
            .await?;
        self.get_session(caller, &session.id).await
    }

    /// `POST .../pause`, `/resume` or `/snapshots` for a session another replica holds: the
    /// owner's answer (a snapshot names the one it kept).
    pub(super) async fn relay_session_step(
        &self,
        caller: &ApiKey,
        session: &SessionRow,
        kind: TurnKind,
    ) -> Result<TurnRow, AppError> {
        self.relay(caller, session, kind, json!({})).await
    }

    /// Inserts the request, tells the owner, waits for its claim (bounded) and its answer.
    async fn relay(
        &self,
        caller: &ApiKey,
        session: &SessionRow,
        kind: TurnKind,
        request: serde_json::Value,
    ) -> Result<TurnRow, AppError> {
        let id = crate::ids::new("tr");
        self.audit
            .insert_turn(&NewTurn {
                id: &id,
                session_id: &session.id,
                owner: &session.instance,
                asked_by: &self.instance,
                key_id: &caller.id,
                kind,
                request,
            })
            .await?;
        let woken = self.replicas.turns.register(&id);
        let waited = self.wait_for_answer(&id, session, &woken).await;
        self.replicas.turns.forget(&id);
        if let Err(err) = self.audit.delete_turn(&id).await {
            tracing::warn!(turn = %id, error = %err, "relayed request row not removed");
        }
        let answer = waited?;
        match (answer.error_code, answer.error.clone()) {
            (None, _) => Ok(answer),
            (Some(code), message) => Err(refusal(code, message.unwrap_or_default())),
        }
    }

    async fn wait_for_answer(
        &self,
        id: &str,
        session: &SessionRow,
        woken: &Notify,
    ) -> Result<TurnRow, AppError> {
        let message = serde_json::to_string(&TurnMessage {
            turn: id.to_owned(),
            to: session.instance.clone(),
        })
        .unwrap_or_default();
        self.audit.notify(TURN, &message).await?;
        let started = tokio::time::Instant::now();
        let answer_within = Duration::from_millis(self.config.ceilings.timeout_ms) + ANSWER_MARGIN;
        let mut closed_seen = None;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    return Err(AppError::ReplicaUnavailable("this replica is shutting down".into()));
                }
                () = woken.notified() => {}
                () = tokio::time::sleep(POLL) => {}
            }
            let Some(row) = self.audit.get_turn(id).await? else {
                return Err(AppError::Internal(format!("relayed request {id} vanished")));
            };
            if row.answered_at.is_some() {
                return Ok(row);
            }
            let (closed, for_good) = self.closed_meanwhile(&session.id).await?;
            if row.picked_at.is_none() {
                let give_up = closed.is_some() || started.elapsed() > PICK_UP_WITHIN;
                if give_up && self.audit.abandon_turn(id).await? {
                    return Err(closed.unwrap_or_else(|| not_picked_up(session)));
                }
                continue;
            }
            // A turn may close its own session (an OOM, a crash) just before its answer is
            // written: any other closing gets a grace period; a lapsed lease does not.
            if let Some(closed) = closed {
                let seen = *closed_seen.get_or_insert_with(tokio::time::Instant::now);
                if for_good || seen.elapsed() > CLOSED_GRACE {
                    return Err(closed);
                }
            }
            if started.elapsed() > answer_within + PICK_UP_WITHIN {
                return Err(AppError::ReplicaUnavailable(format!(
                    "replica {} took the request for session {} but did not answer within {} s",
                    session.instance,
                    session.id,
                    answer_within.as_secs()
                )));
            }
        }
    }

    /// A conflict when the session was closed meanwhile, and whether its owner died (its lease
    /// lapsed: nothing will answer) rather than closed it (e.g. a restart, or the turn itself).
    async fn closed_meanwhile(&self, session: &str) -> Result<(Option<AppError>, bool), AppError> {
        let Some(row) = self.audit.get_session(session).await? else {
            return Ok((None, false));
        };
        let Some(reason) = row.closed_reason else {
            return Ok((None, false));
        };
        let expired = reason == ClosedReason::LeaseExpired;
        let why = if expired {
            format!("its replica {} stopped renewing it", row.instance)
        } else {
            format!("closed by its replica {}", row.instance)
        };
        Ok((
            Some(AppError::Conflict(format!(
                "session {session} is closed ({reason}): {why}"
            ))),
            expired,
        ))
    }

    /// Another replica relayed a request for a session this one holds: claim it and run it.
    pub(super) fn take_turn(self: &Arc<Self>, id: String) {
        let app = Arc::clone(self);
        self.tasks.spawn(async move {
            let claimed = match app.audit.claim_turn(&id, &app.instance).await {
                Ok(Some(row)) => row,
                Ok(None) => return,
                Err(err) => {
                    tracing::warn!(turn = %id, error = %err, "cannot claim a relayed request");
                    return;
                }
            };
            app.tell_asker(&claimed).await;
            let answered = app.run_turn_for(&claimed).await;
            let answer = match &answered {
                Ok(Answered::Nothing) => TurnAnswer::Done(None),
                Ok(Answered::Execution(execution)) => TurnAnswer::Done(Some(execution)),
                Ok(Answered::Snapshot(snapshot)) => TurnAnswer::Kept(snapshot),
                Err((code, message)) => TurnAnswer::Refused(*code, message),
            };
            if let Err(err) = app.audit.answer_turn(&id, answer).await {
                tracing::error!(turn = %id, error = %err, "the answer to a relayed request was not stored");
            }
            app.tell_asker(&claimed).await;
        });
    }

    async fn tell_asker(&self, row: &TurnRow) {
        let message = TurnMessage {
            turn: row.id.clone(),
            to: row.asked_by.clone(),
        };
        let payload = serde_json::to_string(&message).unwrap_or_default();
        if let Err(err) = self.audit.notify(TURN_NEWS, &payload).await {
            tracing::warn!(turn = %row.id, error = %err, "could not tell the asking replica");
        }
    }

    /// The relayed request, as the caller's own (the key looked up again: one revoked
    /// meanwhile does nothing).
    async fn run_turn_for(
        self: &Arc<Self>,
        row: &TurnRow,
    ) -> Result<Answered, (TurnErrorCode, String)> {
        let caller = match self.audit.live_key_by_id(&row.key_id).await {
            Ok(Some(key)) => key,
            Ok(None) => {
                let why = format!("key {} is revoked or expired", row.key_id);
                return Err((TurnErrorCode::Forbidden, why));
            }
            Err(err) => return Err(answer_of(AppError::from(err), &self.instance)),
        };
        let ran = match row.kind {
            TurnKind::Execute => {
                let request: SessionExecutionRequest =
                    serde_json::from_value(row.request.0.clone()).map_err(|err| {
                        (TurnErrorCode::Invalid, format!("relayed request: {err}"))
                    })?;
                self.create_session_execution(&caller, &row.session_id, request)
                    .await
                    .map(|record| Answered::Execution(record.id))
            }
            TurnKind::Close => self
                .delete_session(&caller, &row.session_id)
                .await
                .map(|_| Answered::Nothing),
            TurnKind::Pause => self
                .pause_session(&caller, &row.session_id)
                .await
                .map(|_| Answered::Nothing),
            TurnKind::Resume => self
                .resume_session(&caller, &row.session_id)
                .await
                .map(|_| Answered::Nothing),
            TurnKind::Snapshot => self
                .create_snapshot(&caller, &row.session_id)
                .await
                .map(|snapshot| Answered::Snapshot(snapshot.id)),
        };
        ran.map_err(|err| answer_of(err, &self.instance))
    }

    /// Requests waiting for this replica whose notification was lost.
    pub(super) async fn take_waiting_turns(self: &Arc<Self>) {
        match self.audit.waiting_turns(&self.instance).await {
            Ok(ids) => ids.into_iter().for_each(|id| self.take_turn(id)),
            Err(err) => tracing::warn!(error = %err, "cannot look for relayed requests"),
        }
    }

    /// A [`TURN`] or [`TURN_NEWS`] message.
    pub(super) fn turn_message(self: &Arc<Self>, channel: &str, message: TurnMessage) {
        if message.to != self.instance {
            return;
        }
        if channel == TURN {
            self.take_turn(message.turn);
        } else {
            self.replicas.turns.wake(&message.turn);
        }
    }
}

fn not_picked_up(session: &SessionRow) -> AppError {
    AppError::ReplicaUnavailable(format!(
        "session {} is held by replica {}, which did not take the request within {} s (if it is \
         down, its session is closed as lease_expired once its lease ends); try again later",
        session.id,
        session.instance,
        PICK_UP_WITHIN.as_secs()
    ))
}

/// The owner's error as the row keeps it (an internal one only says where to look).
fn answer_of(err: AppError, instance: &str) -> (TurnErrorCode, String) {
    match err {
        AppError::Invalid(message) => (TurnErrorCode::Invalid, message),
        AppError::NotFound => (TurnErrorCode::NotFound, "no such resource".to_owned()),
        AppError::NotFoundWhy(message) => (TurnErrorCode::NotFound, message),
        AppError::Forbidden(message) => (TurnErrorCode::Forbidden, message),
        AppError::Conflict(message)
        | AppError::RevisionConflict(message)
        | AppError::NoSuggestion(message) => (TurnErrorCode::Conflict, message),
        AppError::RateLimited(message) => (TurnErrorCode::RateLimited, message),
        AppError::ReplicaUnavailable(message) => (TurnErrorCode::Unavailable, message),
        AppError::Unavailable(err) => {
            tracing::error!(error = %super::error_chain(&err), "relayed request: audit store unavailable");
            let why = format!("the audit store is unavailable to replica {instance}");
            (TurnErrorCode::Unavailable, why)
        }
        AppError::Internal(message) => {
            tracing::error!(error = %message, "relayed request failed");
            let why = format!("internal error on replica {instance} (see its log)");
            (TurnErrorCode::Internal, why)
        }
    }
}

/// The owner's answer as this replica's error.
fn refusal(code: TurnErrorCode, message: String) -> AppError {
    match code {
        TurnErrorCode::Invalid => AppError::Invalid(message),
        TurnErrorCode::NotFound => AppError::NotFoundWhy(message),
        TurnErrorCode::Forbidden => AppError::Forbidden(message),
        TurnErrorCode::Conflict => AppError::Conflict(message),
        TurnErrorCode::RateLimited => AppError::RateLimited(message),
        TurnErrorCode::Unavailable => AppError::ReplicaUnavailable(message),
        TurnErrorCode::Internal => AppError::Internal(message),
    }
}
