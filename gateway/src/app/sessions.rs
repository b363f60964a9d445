//! Sessions (DESIGN 10): one sandbox kept alive across an agent's executions. Opening one is a
//! policy decision (`request.kind` `"session"`), audited (`session.created` / `session.denied`);
//! each execution in it is decided again (`session_execution`) and recorded like any other,
//! then runs as one turn of the session's resident runner (see `runtime::Sandbox::turn`). One
//! execution at a time (409), idle and total lifetime capped by the config's ceilings, open
//! sessions per tenant by `max_sessions` (429), each holding a `max_concurrent` slot. An OOM or
//! a runner that does not recover closes it; so do `DELETE`, idleness, its lifetime, and a
//! restart of the gateway (`session.closed` with the reason).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::types::Json;
use tokio_util::sync::CancellationToken;

use policy_engine::{Decision, RequestKind};

use super::floor::Runnable;
use super::home::SandboxHome;
use super::launch::{sandbox_env, with_egress};
use super::pool::Shape;
use super::reaper::LiveGuard;
use super::request::ExecutionRequest;
use super::scheduler::Slot;
use super::{error_chain, App, AppError};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, NewEvent};
use crate::egress::ExecutionEgress;
use crate::role::Role;
use crate::runtime::{Job, Owner, Sandbox, SessionRunner, Waits};
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
}

#[derive(Debug)]
pub(super) struct OpenSession {
    pub(super) tenant: String,
    /// `None` once closed; held for the length of an execution (busy: 409).
    pub(super) held: tokio::sync::Mutex<Option<Held>>,
    pub(super) last_used: Mutex<Instant>,
    pub(super) closing: CancellationToken,
}

/// What an open session owns.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) sandbox: Box<dyn Sandbox>,
    pub(super) home: SandboxHome,
    pub(super) egress: Option<ExecutionEgress>,
    pub(super) runnable: Runnable,
    pub(super) language: String,
    pub(super) created_at: chrono::DateTime<chrono::Utc>,
    pub(super) executions: u64,
    pub(super) _slot: Slot,
    pub(super) _live: LiveGuard,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OpenSession>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open_for(&self, tenant: &str) -> usize {
        self.lock().values().filter(|s| s.tenant == tenant).count()
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<OpenSession>> {
        self.lock().get(id).cloned()
    }
}

impl App {
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
        // Sessions waiting for review count too: approving one must not pass the limit.
        let open = self.sessions.open_for(&caller.tenant)
            + self.audit.pending_sessions(&caller.tenant).await?;
        if open >= self.config.max_sessions {
            return Err(AppError::RateLimited(format!(
                "tenant {} already has {open} open or pending sessions (max_sessions {}); \
                 close one first",
                caller.tenant, self.config.max_sessions
            )));
        }
        let as_execution = ExecutionRequest {
            language: request.language.clone(),
            code: String::new(),
            files: Vec::new(),
            network: request.network.clone(),
            mounts: request.mounts.clone(),
            limits: request.limits.clone(),
            labels: request.labels.clone(),
            wait: true,
        };
        let mut input = self.policy_input(caller, &as_execution, &[]);
        input.request.kind = RequestKind::Session;
        let said = self.policy.current().state.decide(&input);
        let mut decision = said.clone();
        let runnable = self.enforce_floor(&request.language, &mut decision);
        let id = crate::ids::new("ss");
        let event = |kind| NewEvent {
            kind,
            execution_id: None,
            key_id: Some(caller.id.clone()),
            tenant: Some(caller.tenant.clone()),
            decision_id: None,
            allow: Some(decision.allow),
            reasons: json!(decision.reasons),
            input: json!({"session_id": id, "request": input}),
            decision: json!(said),
            policy_revision: Some(self.policy.current().state.revision().to_owned()),
        };
        let runnable = match runnable {
            Some(runnable) if !decision.require_approval => runnable,
            Some(runnable) => {
                let held = super::session_approvals::HeldSession {
                    id: &id,
                    request: &request,
                    input: &input,
                    decision: &decision,
                    runnable: &runnable,
                    event: event(api_types::EventKind::ApprovalRequested),
                };
                return self.hold_session(caller, held).await;
            }
            None => {
                self.audit
                    .record_event(&event(api_types::EventKind::SessionDenied))
                    .await?;
                return Ok(Opened::Denied(decision));
            }
        };
        let ticket = self
            .scheduler
            .admit(&caller.tenant)
            .map_err(|full| AppError::RateLimited(full.to_string()))?;
        let slot = ticket
            .slot()
            .await
            .ok_or_else(|| AppError::Internal("the gateway is shutting down".into()))?;
        let (idle, ttl) = self.session_lifetimes(&request);
        let live = self.live.track(&id);
        let held = self
            .start_session(
                &id,
                &caller.tenant,
                runner,
                &request.language,
                runnable,
                (slot, live),
            )
            .await?;
        let now = crate::ids::now_micros();
        let row = SessionRow {
            id: id.clone(),
            tenant: caller.tenant.clone(),
            key_id: caller.id.clone(),
            language: request.language.clone(),
            status: SessionStatus::Ready,
            closed_reason: None,
            decision: Json(json!(decision)),
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
        };
        let stored = async {
            self.audit.insert_session(&row).await?;
            self.audit
                .record_event(&event(api_types::EventKind::SessionCreated))
                .await
        };
        if let Err(err) = stored.await {
            release(held).await;
            return Err(err.into());
        }
        self.keep_open(id, &caller.tenant, held, (idle, ttl));
        Ok(Opened::Ready(row))
    }

    /// Holds a started session open on this gateway and watches its idle and total lifetime.
    pub(super) fn keep_open(
        self: &Arc<Self>,
        id: String,
        tenant: &str,
        held: Held,
        (idle, ttl): (u64, u64),
    ) {
        let open = Arc::new(OpenSession {
            tenant: tenant.to_owned(),
            held: tokio::sync::Mutex::new(Some(held)),
            last_used: Mutex::new(Instant::now()),
            closing: self.shutdown.child_token(),
        });
        self.sessions.lock().insert(id.clone(), Arc::clone(&open));
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
        runner: SessionRunner,
        language: &str,
        runnable: Runnable,
        (slot, live): (Slot, LiveGuard),
    ) -> Result<Held, AppError> {
        let unavailable = |what: &str, err: &dyn std::fmt::Display| {
            AppError::Internal(format!("starting the session sandbox: {what}: {err}"))
        };
        let shape = Shape::of(&runnable);
        let home = SandboxHome::create(
            &self.egress_root,
            &self.scratch_root,
            id,
            shape.limits.disk_mb,
        )
        .map_err(|err| unavailable("its directories", &err))?;
        let mut plan = self.plan(
            id,
            Owner::Execution(id.to_owned()),
            &shape,
            &home,
            Waits::Session(runner),
        );
        plan.mounts.clone_from(&runnable.mounts);
        let mut sandbox = match self.runtime.start(plan).await {
            Ok(sandbox) => sandbox,
            Err(err) => {
                home.remove();
                return Err(unavailable("the sandbox", &err));
            }
        };
        let egress = match (&runnable.network, self.egress.as_ref()) {
            (Some(grant), Some(proxy)) => {
                // Named before the first connection can arrive: every row names the session.
                self.session_cursors.open(id);
                ExecutionEgress::start(
                    proxy,
                    &home.egress_dir,
                    id,
                    tenant,
                    grant,
                    self.shutdown.child_token(),
                )
                .map(Some)
                .map_err(|err| unavailable("its egress grant", &error_chain(&err)))
            }
            _ => Ok(None),
        };
        let opened = match egress {
            Ok(egress) => sandbox
                .open_session(opening_line(egress.as_ref(), runnable.limits.cpus))
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
                created_at: crate::ids::now_micros(),
                executions: 0,
                _slot: slot,
                _live: live,
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
                        // Shutting down: the session does not outlive its gateway.
                        if app.shutdown.is_cancelled() {
                            app.close_session(&id, ClosedReason::GatewayRestart).await;
                        }
                        return;
                    }
                }
                let still = *open
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
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
        self.session_cursors.close(id);
        let closed = match self.audit.close_session(id, reason).await {
            Ok(closed) => closed,
            Err(err) => {
                tracing::error!(session_id = %id, error = %err, "closing the session record failed");
                return None;
            }
        };
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
            reasons: json!([]),
            input: json!({"session_id": row.id}),
            decision: json!({
                "closed_reason": row.closed_reason,
                "executions": row.executions,
                "created_at": row.created_at,
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

    pub async fn get_session(&self, caller: &ApiKey, id: &str) -> Result<SessionRow, AppError> {
        match self.audit.get_session(id).await? {
            Some(row) if row.tenant == caller.tenant || caller.is_any(&Role::ACROSS_TENANTS) => {
                Ok(row)
            }
            Some(row) => Err(self.cross_tenant_probe(caller, &row.id, &row.tenant).await),
            None => Err(AppError::NotFound),
        }
    }

    pub async fn list_sessions(&self, caller: &ApiKey) -> Result<Vec<SessionRow>, AppError> {
        let tenant = (!caller.is_any(&Role::ACROSS_TENANTS)).then_some(caller.tenant.as_str());
        Ok(self.audit.list_sessions(tenant).await?)
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

/// The opening line: the session's environment, and with a grant its bridge, trust bundle and
/// credential placeholders (as a plain execution's job carries them).
fn opening_line(egress: Option<&ExecutionEgress>, cpus: f64) -> Job<'static> {
    let mut env = sandbox_env(cpus);
    let mut files = Vec::new();
    let proxy = egress.map(|egress| with_egress(egress, &mut env, &mut files));
    Job {
        argv: vec!["session".to_owned()],
        cwd: Some(crate::runtime::WORKSPACE.to_owned()),
        env: Some(env),
        files,
        proxy,
        exit_nonce: None,
    }
}
