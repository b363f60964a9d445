//! Sessions: one sandbox kept alive across an agent's executions. Opening one is a
//! policy decision through the pipeline (`pipeline.rs`, `request.kind` `"session"`), audited
//! (`session.created` / `session.denied`, or held for review: `approvals.rs`);
//! each execution in it is decided again (`session_execution`) and recorded like any other,
//! then runs as one turn of the session's resident runner (see `runtime::Sandbox::turn`). One
//! execution at a time (409), idle and total lifetime capped by the config's ceilings, open
//! sessions per tenant by `max_sessions` (429), each holding a `max_concurrent` slot. An OOM or
//! a runner that does not recover closes it; so do `DELETE`, idleness, its lifetime, and a
//! restart of the gateway (`session.closed` with the reason).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::types::Json;
use tokio_util::sync::CancellationToken;

use policy_engine::Decision;

use super::floor::Runnable;
use super::home::SandboxHome;
use super::launch::{sandbox_env, with_egress};
use super::pipeline::{Ask, Outcome, Subject};
use super::reaper::LiveGuard;
use super::request::ExecutionRequest;
use super::scheduler::Slot;
use super::subjects::SessionRecord;
use super::{error_chain, App, AppError};
use crate::audit::events::{self, sessions as session_events};
use crate::audit::pause_claims::OwnClose;
use crate::audit::sessions::{SessionRow, SessionsFull};
use crate::audit::snapshots::SnapshotRow;
use crate::audit::{ApiKey, NewEvent};
use crate::egress::ExecutionEgress;
use crate::role::Role;
use crate::runtime::{Job, Sandbox, SessionRunner};
use crate::session_wire::{ClosedReason, SessionStatus};

pub use crate::session_wire::{SessionExecutionRequest, SessionRequest, TurnLimits};

/// What became of `POST /v1/sessions`.
#[derive(Debug)]
pub enum Opened {
    Ready(SessionRow),
    Denied(Decision),
    /// Held for review (202): the row is `pending_approval` and names its `approval_id`.
    PendingApproval(SessionRow),
}

/// The open sessions this gateway holds.
#[derive(Debug, Default)]
pub struct Sessions {
    open: Mutex<HashMap<String, Arc<OpenSession>>>,
    /// Places taken in the sessions' share of `max_concurrent` ([`SessionShare`]).
    shares: Arc<AtomicUsize>,
    /// Open sessions whose sandbox is checkpointed to disk (`app::snapshots`).
    pub(super) paused: super::snapshots::PausedSessions,
}

#[derive(Debug)]
pub(super) struct OpenSession {
    /// `None` once closed; held for the length of an execution (busy: 409).
    pub(super) held: tokio::sync::Mutex<Option<Held>>,
    pub(super) last_used: Mutex<Instant>,
    pub(super) closing: CancellationToken,
    /// Processes running beside the runner (`app::session_procs`): the session is in use
    /// while any runs, so it is neither idle nor paused nor snapshotted under them.
    pub(super) processes: std::sync::atomic::AtomicUsize,
    /// Its extra code contexts (`app::contexts`); they end with it.
    pub(super) contexts: super::contexts::Contexts,
    /// Set while a pause may hold `held` (`App::pause_held`): an execution arriving then
    /// waits for the pause and resumes the session instead of being answered busy.
    pub(super) pausing: std::sync::atomic::AtomicBool,
}

impl OpenSession {
    /// Whether a process runs beside the runner now.
    pub(super) fn runs_processes(&self) -> bool {
        self.processes.load(std::sync::atomic::Ordering::SeqCst) > 0
    }
}

/// What an open session owns.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) sandbox: Box<dyn Sandbox>,
    pub(super) home: SandboxHome,
    pub(super) egress: Option<ExecutionEgress>,
    pub(super) runnable: Runnable,
    pub(super) language: String,
    pub(super) executions: u64,
    pub(super) _slot: Slot,
    pub(super) _live: LiveGuard,
    pub(super) _share: SessionShare,
    /// How its sandbox was got (the row's `start`).
    pub(super) start: super::launch::Start,
}

/// A session's place in the sessions' share of `max_concurrent` on this replica: sessions
/// hold at most [`session_slots`] of its slots, so they cannot starve plain executions.
#[derive(Debug)]
pub(super) struct SessionShare {
    taken: Arc<AtomicUsize>,
}

impl Drop for SessionShare {
    fn drop(&mut self) {
        self.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The slots of `max_concurrent` sessions may hold on one replica: half of them (at least
/// one); the rest stay for plain executions (with `max_concurrent: 1` they share the one).
pub fn session_slots(max_concurrent: usize) -> usize {
    (max_concurrent / 2).max(1)
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OpenSession>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sessions open on this replica (`sandgate_sessions_open`).
    pub fn open_here(&self) -> usize {
        self.lock().len()
    }

    /// A place in the sessions' share, if fewer than `max` are taken.
    fn take_share(&self, max: usize) -> Option<SessionShare> {
        self.shares
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                (taken < max).then_some(taken + 1)
            })
            .ok()?;
        Some(SessionShare {
            taken: Arc::clone(&self.shares),
        })
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<OpenSession>> {
        self.lock().get(id).cloned()
    }

    /// Forgets the session here without closing it (another replica serves it now).
    pub(super) fn remove(&self, id: &str) -> Option<Arc<OpenSession>> {
        self.lock().remove(id)
    }
}

impl App {
    /// A place in the sessions' share of `max_concurrent`, or 429.
    pub(super) fn session_share(&self) -> Result<SessionShare, AppError> {
        let max = session_slots(self.config.max_concurrent);
        self.sessions.take_share(max).ok_or_else(|| {
            AppError::RateLimited(format!(
                "sessions already hold {max} of the {} slots of max_concurrent on this gateway \
                 (their share; the rest stay for plain executions): close one first",
                self.config.max_concurrent
            ))
        })
    }

    pub async fn create_session(
        self: &Arc<Self>,
        caller: &ApiKey,
        request: SessionRequest,
    ) -> Result<Opened, AppError> {
        let runner = SessionRunner::for_language(&request.language).ok_or_else(|| {
            AppError::Invalid(format!(
                "language {:?} has no session runner; sessions run python or bash",
                request.language
            ))
        })?;
        // A first look, to refuse before deciding; the count that holds is taken again with
        // the insert, under the tenant's lock (`AuditStore::insert_session`).
        let open = self.audit.sessions_not_closed(&caller.tenant).await?;
        if open >= self.config.max_sessions {
            return Err(sessions_full(SessionsFull {
                open,
                max: self.config.max_sessions,
            }));
        }
        // A fork (DESIGN 15): the snapshot is the caller's to see, and the policy is told.
        let fork = self.fork_source(caller, &request).await?;
        let ask = Ask {
            caller,
            subject: Subject::Session(&request),
            request: &as_execution(&request),
            files: &[],
            from_snapshot: fork.as_ref().map(SnapshotRow::policy_input),
        };
        match self.pipeline::<SessionRecord>(&ask).await? {
            Outcome::Denied(record) => Ok(Opened::Denied(record.decision)),
            Outcome::Held(row) => Ok(Opened::PendingApproval(row)),
            Outcome::Admitted(record, runnable) => {
                let admitted = (runner, record, runnable);
                self.open_admitted(caller, &request, fork.as_ref(), admitted)
                    .await
            }
        }
    }

    /// Opens a session the pipeline admitted: its place in the sessions' share and the queue,
    /// its sandbox, then its row and `session.created`.
    async fn open_admitted(
        self: &Arc<Self>,
        caller: &ApiKey,
        request: &SessionRequest,
        fork: Option<&SnapshotRow>,
        (runner, record, runnable): (SessionRunner, SessionRecord, Runnable),
    ) -> Result<Opened, AppError> {
        let id = record.id.clone();
        let share = self.session_share()?;
        let ticket = self
            .scheduler
            .admit(&caller.tenant)
            .map_err(|full| AppError::RateLimited(full.to_string()))?;
        let slot = ticket
            .slot()
            .await
            .ok_or_else(|| AppError::Internal("the gateway is shutting down".into()))?;
        let (idle, ttl) = self.session_lifetimes(request);
        let live = self.live.track(&id);
        let held = match fork {
            Some(snapshot) => {
                let whose = super::snapshots::Whose {
                    id: &id,
                    tenant: &caller.tenant,
                    key_id: &caller.id,
                };
                self.start_fork(whose, snapshot, runnable, (slot, live, share))
                    .await?
            }
            None => {
                self.start_session(
                    &id,
                    &caller.tenant,
                    (runner, StartsIn::of(request)),
                    &request.language,
                    runnable,
                    (slot, live, share),
                )
                .await?
            }
        };
        let now = crate::ids::now_micros();
        let row = SessionRow {
            id: id.clone(),
            tenant: caller.tenant.clone(),
            key_id: caller.id.clone(),
            language: request.language.clone(),
            status: SessionStatus::Ready,
            closed_reason: None,
            decision: Json(record.recorded.clone()),
            limits: Json(json!(held.runnable.limits)),
            idle_timeout_s: i64::try_from(idle).unwrap_or(i64::MAX),
            ttl_s: i64::try_from(ttl).unwrap_or(i64::MAX),
            executions: 0,
            instance: self.instance.clone(),
            container: Some(held.sandbox.name().to_owned()),
            created_at: now,
            last_used_at: now,
            expires_at: now + chrono::Duration::seconds(i64::try_from(ttl).unwrap_or(0)),
            closed_at: None,
            approval_id: None,
            start: Some(api_types::SessionStart(held.start)),
        };
        let created = record.event(api_types::EventKind::SessionCreated);
        self.sessions
            .paused
            .set_idle_action(&id, self.idle_pauses(request));
        let held = self.register_session(&row, &created, held).await?;
        self.keep_open(id, held, (idle, ttl));
        Ok(Opened::Ready(row))
    }

    /// Stores a started session's row, counted against `max_sessions` with the insert, and its
    /// `session.created`; when either is refused or fails, its sandbox is removed.
    async fn register_session(
        &self,
        row: &SessionRow,
        created: &NewEvent,
        held: Held,
    ) -> Result<Held, AppError> {
        let stored = match self
            .audit
            .insert_session(row, self.config.max_sessions)
            .await
        {
            Ok(Ok(())) => self
                .audit
                .record_event(created)
                .await
                .map(|_| ())
                .map_err(AppError::from),
            // Others opened theirs while this one started: it never was a session.
            Ok(Err(full)) => Err(sessions_full(full)),
            Err(err) => Err(AppError::from(err)),
        };
        match stored {
            Ok(()) => Ok(held),
            Err(err) => {
                release(held).await;
                Err(err)
            }
        }
    }

    /// Holds a started session open on this gateway and watches its idle and total lifetime.
    pub(super) fn keep_open(self: &Arc<Self>, id: String, held: Held, lifetimes: (u64, u64)) {
        self.keep_registered(id, Some(held), lifetimes);
    }

    /// Holds a session open on this gateway, with its sandbox or paused (`None`: restored on
    /// its next use, `app::snapshots`), and watches its idle and total lifetime.
    pub(super) fn keep_registered(
        self: &Arc<Self>,
        id: String,
        held: Option<Held>,
        (idle, ttl): (u64, u64),
    ) {
        let open = Arc::new(OpenSession {
            held: tokio::sync::Mutex::new(held),
            last_used: Mutex::new(Instant::now()),
            closing: self.shutdown.child_token(),
            processes: std::sync::atomic::AtomicUsize::new(0),
            contexts: super::contexts::Contexts::default(),
            pausing: std::sync::atomic::AtomicBool::new(false),
        });
        {
            let mut sessions = self.sessions.lock();
            // Two requests taking over one paused session of another replica at once
            // (`app::snapshot_replicas`): the first registration holds.
            if sessions.contains_key(&id) {
                return;
            }
            sessions.insert(id.clone(), Arc::clone(&open));
        }
        self.watch_session(id, open, idle, ttl);
    }

    /// The idle limit and lifetime asked for, capped by the ceilings.
    pub(super) fn session_lifetimes(&self, request: &SessionRequest) -> (u64, u64) {
        let ceilings = &self.config.ceilings;
        let idle = request
            .idle_timeout_s
            .unwrap_or(ceilings.session_idle_s)
            .clamp(1, ceilings.session_idle_s.max(1));
        let ttl = request
            .ttl_s
            .unwrap_or(ceilings.session_ttl_s)
            .clamp(1, ceilings.session_ttl_s.max(1));
        (idle, ttl)
    }

    /// The sandbox, its grant, the opening line.
    pub(super) async fn start_session(
        &self,
        id: &str,
        tenant: &str,
        (runner, starts_in): (SessionRunner, StartsIn),
        language: &str,
        runnable: Runnable,
        (slot, live, share): (Slot, LiveGuard, SessionShare),
    ) -> Result<Held, AppError> {
        let unavailable = |what: &str, err: &dyn std::fmt::Display| {
            AppError::Internal(format!("starting the session sandbox: {what}: {err}"))
        };
        let (claimed, start) = self
            .session_sandbox(id, runner, language, &runnable)
            .await
            .map_err(|err| unavailable("the sandbox", &err))?;
        let super::pool::Claimed { mut sandbox, home } = claimed;
        let egress = match self.egress.as_ref() {
            Some(proxy) => {
                // Named before the first connection can arrive: every row names the session.
                self.session_cursors.open(id);
                ExecutionEgress::start(
                    proxy,
                    &home.egress_dir,
                    id,
                    tenant,
                    runnable.network.as_ref(),
                    self.shutdown.child_token(),
                )
                .map(Some)
                .map_err(|err| unavailable("its egress grant", &error_chain(&err)))
            }
            None => Ok(None),
        };
        let opened = match egress {
            Ok(egress) => sandbox
                .open_session(opening_line(
                    egress.as_ref(),
                    runnable.limits.cpus,
                    starts_in,
                ))
                .await
                .map(|()| egress)
                .map_err(|err| unavailable("the opening line", &err)),
            Err(err) => Err(err),
        };
        match opened {
            Ok(egress) => Ok(Held {
                sandbox,
                home,
                egress,
                runnable,
                language: language.to_owned(),
                executions: 0,
                _slot: slot,
                _live: live,
                _share: share,
                start,
            }),
            Err(err) => {
                sandbox.discard().await;
                home.remove();
                self.session_cursors.close(id);
                Err(err)
            }
        }
    }

    /// Closes the session when it has been idle too long or reached its lifetime.
    fn watch_session(self: &Arc<Self>, id: String, open: Arc<OpenSession>, idle: u64, ttl: u64) {
        let app = Arc::clone(self);
        let expires = Instant::now() + Duration::from_secs(ttl);
        self.tasks.spawn(async move {
            loop {
                let last = *open
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let idle_at = last + Duration::from_secs(idle);
                let (wake, reason) = if idle_at < expires {
                    (idle_at, ClosedReason::Idle)
                } else {
                    (expires, ClosedReason::Ttl)
                };
                tokio::select! {
                    () = tokio::time::sleep_until(wake.into()) => {}
                    () = open.closing.cancelled() => {
                        // Shutting down: the session does not outlive its gateway, unless it
                        // is kept paused for the next run (`app::snapshots`).
                        if app.shutdown.is_cancelled() {
                            app.stop_session(&id).await;
                        }
                        return;
                    }
                }
                if reason == ClosedReason::Idle && open.runs_processes() {
                    // A running process is use, even a silent one: the clock starts again.
                    *open
                        .last_used
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Instant::now();
                    continue;
                }
                let still = *open
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if reason == ClosedReason::Idle && still == last && app.pause_when_idle(&id).await {
                    // Paused (DESIGN 15): its idle clock starts again; its lifetime holds.
                    *open
                        .last_used
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Instant::now();
                    continue;
                }
                if reason == ClosedReason::Ttl || still == last {
                    // A busy session closes once its execution ended (the lock waits for it).
                    app.close_session(&id, reason).await;
                    return;
                }
            }
        });
    }

    /// Closes an open session of this gateway: the sandbox is removed, the record closed.
    pub(super) async fn close_session(&self, id: &str, reason: ClosedReason) -> Option<SessionRow> {
        let open = self.sessions.lock().remove(id)?;
        open.closing.cancel();
        let held = open.held.lock().await.take();
        if let Some(held) = held {
            release(held).await;
        }
        open.contexts.close_all().await;
        self.session_cursors.close(id);
        let closed = match self
            .audit
            .close_own_session(id, reason, &self.instance)
            .await
        {
            Ok(OwnClose::Closed(row)) => Some(*row),
            Ok(OwnClose::AlreadyClosed) => None,
            Ok(OwnClose::Elsewhere(owner)) => {
                // A stale registration of a paused session another replica serves now: its
                // image and pause are that replica's.
                tracing::info!(session_id = %id, %owner, "not closed: another replica serves it");
                drop(self.sessions.paused.take(id));
                self.sessions.paused.set_idle_action(id, true);
                return None;
            }
            Err(err) => {
                tracing::error!(session_id = %id, error = %err, "closing the session record failed");
                self.sessions.paused.forget(id);
                return None;
            }
        };
        self.sessions.paused.forget(id);
        if let Some(row) = &closed {
            self.record_session_closed(row).await;
        }
        closed
    }

    async fn record_session_closed(&self, row: &SessionRow) {
        let event = NewEvent {
            kind: api_types::EventKind::SessionClosed,
            execution_id: None,
            key_id: Some(row.key_id.clone()),
            tenant: Some(row.tenant.clone()),
            decision_id: None,
            allow: None,
            reasons: events::no_reasons(),
            input: events::column(&session_events::SessionRef {
                session_id: row.id.clone(),
            }),
            decision: events::column(&session_events::HeldClosed {
                closed_reason: row.closed_reason,
                executions: row.executions,
                created_at: row.created_at,
            }),
            policy_revision: None,
        };
        if let Err(err) = self.audit.record_event(&event).await {
            tracing::error!(session_id = %row.id, error = %err, "session.closed not recorded");
        }
    }

    /// Closes what a previous run of the gateway left open (their sandboxes ended with it;
    /// the reaper removes the containers).
    pub async fn close_sessions_left(&self) {
        let open: Vec<String> = self.sessions.lock().keys().cloned().collect();
        match self.audit.close_sessions_left(&self.instance, &open).await {
            Ok(rows) => {
                for row in &rows {
                    self.record_session_closed(row).await;
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot close sessions left by a restart"),
        }
    }

    /// The session, for a key that may see it: reviewers, auditors and admins every one, an
    /// agent those it opened or the policy shares with it (`session_owner`).
    pub async fn get_session(&self, caller: &ApiKey, id: &str) -> Result<SessionRow, AppError> {
        match self.audit.get_session(id).await? {
            Some(row) if caller.is_any(&Role::ACROSS_TENANTS) => Ok(row),
            Some(row) if row.tenant == caller.tenant => {
                self.check_session_owner(caller, &row).await?;
                Ok(row)
            }
            Some(row) => Err(self.cross_tenant_probe(caller, &row.id, &row.tenant).await),
            None => Err(AppError::NotFound),
        }
    }

    pub async fn list_sessions(&self, caller: &ApiKey) -> Result<Vec<SessionRow>, AppError> {
        if caller.is_any(&Role::ACROSS_TENANTS) {
            return Ok(self.audit.list_sessions(None).await?);
        }
        let rows = self.audit.list_sessions(Some(&caller.tenant)).await?;
        self.visible_sessions(caller, rows).await
    }

    pub async fn delete_session(&self, caller: &ApiKey, id: &str) -> Result<SessionRow, AppError> {
        let row = self.get_session(caller, id).await?;
        if row.is(SessionStatus::Closed) {
            return Ok(row);
        }
        let mut row = row;
        if row.is(SessionStatus::PendingApproval) && self.sessions.get(id).is_none() {
            if let Some(closed) = self.withdraw_session(caller, &row).await? {
                return Ok(closed);
            }
            // Decided meanwhile: act on what it is now.
            row = self.get_session(caller, id).await?;
            if row.is(SessionStatus::Closed) {
                return Ok(row);
            }
        }
        if row.instance != self.instance && self.sessions.get(id).is_none() {
            return self.relay_session_close(caller, &row).await;
        }
        match self.close_session(id, ClosedReason::Deleted).await {
            Some(closed) => Ok(closed),
            None => self.get_session(caller, id).await,
        }
    }
}

/// Removes the sandbox and its host side; the slot and the live entry go with `held`.
pub(super) async fn release(held: Held) {
    let Held {
        sandbox,
        home,
        egress,
        ..
    } = held;
    sandbox.discard().await;
    if let Some(egress) = egress {
        egress.finish().await;
    }
    home.remove();
}

/// Where a session's runner starts (its cells' working directory) and its `HOME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StartsIn {
    /// sandgate's own sessions, as its executions: `/workspace`, `HOME=/tmp`.
    Workspace,
    /// E2B sandboxes: `/home/user`, their `HOME` too, as E2B's SDKs assume (`pwd`, `~`,
    /// `$HOME` in a command or a `run_code` cell).
    UserHome,
}

impl StartsIn {
    /// E2B's home for a session the E2B layer asked for.
    pub(super) fn of(request: &SessionRequest) -> Self {
        match request.e2b {
            Some(_) => StartsIn::UserHome,
            None => StartsIn::Workspace,
        }
    }
}

/// The opening line: the session's environment and working directory, and with a grant its
/// bridge, trust bundle and credential placeholders (as a plain execution's job carries them).
fn opening_line(egress: Option<&ExecutionEgress>, cpus: f64, starts_in: StartsIn) -> Job<'static> {
    let mut env = sandbox_env(cpus);
    let cwd = match starts_in {
        StartsIn::Workspace => crate::runtime::WORKSPACE,
        StartsIn::UserHome => {
            env.insert("HOME".to_owned(), crate::runtime::USER_HOME.to_owned());
            crate::runtime::USER_HOME
        }
    };
    let mut files = Vec::new();
    let proxy = egress.map(|egress| with_egress(egress, &mut env, &mut files));
    Job {
        argv: vec!["session".to_owned()],
        cwd: Some(cwd.to_owned()),
        env: Some(env),
        files,
        proxy,
        exit_nonce: None,
    }
}

/// The environment an E2B session's runner started with (its proxy settings included), for
/// its extra code contexts (`app::contexts`): only E2B sandboxes have them.
pub(super) fn opening_env(held: &Held) -> std::collections::BTreeMap<String, String> {
    let line = opening_line(
        held.egress.as_ref(),
        held.runnable.limits.cpus,
        StartsIn::UserHome,
    );
    line.env.unwrap_or_default()
}

/// A session's opening, asked in an execution's terms: no code, no files.
fn as_execution(request: &SessionRequest) -> ExecutionRequest {
    ExecutionRequest {
        language: request.language.clone(),
        code: String::new(),
        files: Vec::new(),
        network: request.network.clone(),
        mounts: request.mounts.clone(),
        limits: request.limits.clone(),
        labels: request.labels.clone(),
        wait: true,
    }
}

fn sessions_full(full: SessionsFull) -> AppError {
    AppError::RateLimited(format!("{full}; close one first"))
}
