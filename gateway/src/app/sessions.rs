//! Sessions (DESIGN 10): one sandbox kept alive across an agent's executions. Opening one is a
//! policy decision (`request.kind: "session"`), audited (`session.created` / `session.denied`);
//! each execution in it is decided again (`session_execution`) and recorded like any other,
//! then runs as one turn of the session's resident runner (see `runtime::Sandbox::turn`). One
//! execution at a time (409), idle and total lifetime capped by the config's ceilings, open
//! sessions per tenant by `max_sessions` (429), each holding a `max_concurrent` slot. An OOM or
//! a runner that does not recover closes it; so do `DELETE`, idleness, its lifetime, and a
//! restart of the gateway (`session.closed` with the reason).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use sqlx::types::Json;
use tokio_util::sync::CancellationToken;

use policy_engine::{Decision, HostPort, RequestKind, RequestedLimits, SessionInput};

use super::floor::Runnable;
use super::home::SandboxHome;
use super::launch::sandbox_env;
use super::pool::Shape;
use super::reaper::LiveGuard;
use super::request::{ExecutionRequest, FileUpload};
use super::scheduler::Slot;
use super::{error_chain, App, AppError};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, Completion, ExecutionRow, NewEvent};
use crate::egress::ExecutionEgress;
use crate::outputs::Collected;
use crate::runtime::{
    Ending, Job, JobFile, JobProxy, Owner, Sandbox, SessionRunner, TurnEnding, TurnRan, Waits,
};

/// Body of `POST /v1/sessions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    pub language: String,
    #[serde(default)]
    pub network: Vec<HostPort>,
    #[serde(default)]
    pub mounts: Vec<String>,
    #[serde(default)]
    pub limits: RequestedLimits,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    pub idle_timeout_s: Option<u64>,
    pub ttl_s: Option<u64>,
}

/// Body of `POST /v1/sessions/{id}/executions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionExecutionRequest {
    pub code: String,
    #[serde(default)]
    pub files: Vec<FileUpload>,
    #[serde(default)]
    pub limits: TurnLimits,
    /// Accepted for the shape of 4.2; a session execution always answers when it ended.
    #[serde(default)]
    pub wait: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnLimits {
    pub timeout_ms: Option<u64>,
}

/// What became of `POST /v1/sessions`.
#[derive(Debug)]
pub enum Opened {
    Ready(SessionRow),
    Denied(Decision),
}

/// The open sessions this gateway holds.
#[derive(Debug, Default)]
pub struct Sessions {
    open: Mutex<HashMap<String, Arc<OpenSession>>>,
}

#[derive(Debug)]
struct OpenSession {
    tenant: String,
    /// `None` once closed; held for the length of an execution (busy: 409).
    held: tokio::sync::Mutex<Option<Held>>,
    last_used: Mutex<Instant>,
    closing: CancellationToken,
}

/// What an open session owns.
#[derive(Debug)]
struct Held {
    sandbox: Box<dyn Sandbox>,
    home: SandboxHome,
    egress: Option<ExecutionEgress>,
    runnable: Runnable,
    language: String,
    created_at: chrono::DateTime<chrono::Utc>,
    executions: u64,
    _slot: Slot,
    _live: LiveGuard,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OpenSession>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open_for(&self, tenant: &str) -> usize {
        self.lock().values().filter(|s| s.tenant == tenant).count()
    }

    fn get(&self, id: &str) -> Option<Arc<OpenSession>> {
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
        if !request.network.is_empty() {
            // Egress rows reference an execution; a session's connections have none to name
            // until the proxy learns about sessions. Refused rather than run half-audited.
            return Err(AppError::Invalid(
                "sessions cannot ask for network destinations yet; use a plain execution".into(),
            ));
        }
        if self.sessions.open_for(&caller.tenant) >= self.config.max_sessions {
            return Err(AppError::RateLimited(format!(
                "tenant {} already has {} open sessions (max_sessions); close one first",
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
            _ => {
                self.audit.record_event(&event("session.denied")).await?;
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
                caller,
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
            status: "ready".into(),
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
        };
        let stored = async {
            self.audit.insert_session(&row).await?;
            self.audit.record_event(&event("session.created")).await
        };
        if let Err(err) = stored.await {
            release(held).await;
            return Err(err.into());
        }
        let open = Arc::new(OpenSession {
            tenant: caller.tenant.clone(),
            held: tokio::sync::Mutex::new(Some(held)),
            last_used: Mutex::new(Instant::now()),
            closing: self.shutdown.child_token(),
        });
        self.sessions.lock().insert(id.clone(), Arc::clone(&open));
        self.watch_session(id, open, idle, ttl);
        Ok(Opened::Ready(row))
    }

    /// The idle limit and lifetime asked for, capped by the ceilings.
    fn session_lifetimes(&self, request: &SessionRequest) -> (u64, u64) {
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
    async fn start_session(
        &self,
        id: &str,
        caller: &ApiKey,
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
            (Some(grant), Some(proxy)) => ExecutionEgress::start(
                proxy,
                &home.egress_dir,
                id,
                &caller.tenant,
                grant,
                self.shutdown.child_token(),
            )
            .map(Some)
            .map_err(|err| unavailable("its egress grant", &error_chain(&err))),
            _ => Ok(None),
        };
        let opened = match egress {
            Ok(egress) => sandbox
                .open_session(opening_line(egress.is_some()))
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
                    (idle_at, "idle")
                } else {
                    (expires, "ttl")
                };
                tokio::select! {
                    () = tokio::time::sleep_until(wake.into()) => {}
                    () = open.closing.cancelled() => {
                        // Shutting down: the session does not outlive its gateway.
                        if app.shutdown.is_cancelled() {
                            app.close_session(&id, "gateway_restart").await;
                        }
                        return;
                    }
                }
                let still = *open
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if reason == "ttl" || still == last {
                    // A busy session closes once its execution ended (the lock waits for it).
                    app.close_session(&id, reason).await;
                    return;
                }
            }
        });
    }

    /// Closes an open session of this gateway: the sandbox is removed, the record closed.
    pub(super) async fn close_session(&self, id: &str, reason: &str) -> Option<SessionRow> {
        let open = self.sessions.lock().remove(id)?;
        open.closing.cancel();
        let held = open.held.lock().await.take();
        if let Some(held) = held {
            release(held).await;
        }
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
            kind: "session.closed",
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
            Some(row) if row.tenant == caller.tenant || caller.role != "agent" => Ok(row),
            Some(row) => Err(self.cross_tenant_probe(caller, &row.id, &row.tenant).await),
            None => Err(AppError::NotFound),
        }
    }

    pub async fn list_sessions(&self, caller: &ApiKey) -> Result<Vec<SessionRow>, AppError> {
        let tenant = (caller.role == "agent").then_some(caller.tenant.as_str());
        Ok(self.audit.list_sessions(tenant).await?)
    }

    pub async fn delete_session(&self, caller: &ApiKey, id: &str) -> Result<SessionRow, AppError> {
        let row = self.get_session(caller, id).await?;
        if row.status == "closed" {
            return Ok(row);
        }
        match self.close_session(id, "deleted").await {
            Some(closed) => Ok(closed),
            None => self.get_session(caller, id).await,
        }
    }

    /// One execution in a session: decided, recorded, run as a turn, completed.
    pub async fn create_session_execution(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        request: SessionExecutionRequest,
    ) -> Result<ExecutionRow, AppError> {
        let row = self.get_session(caller, id).await?;
        let open = self
            .sessions
            .get(id)
            .ok_or_else(|| closed_conflict(id, &row))?;
        let Ok(mut guard) = open.held.try_lock() else {
            return Err(AppError::Conflict(format!(
                "session {id} is busy: one execution at a time"
            )));
        };
        let Some(held) = guard.as_mut() else {
            return Err(closed_conflict(id, &row));
        };
        let _ = self.audit.set_session_status(id, "busy", false).await;
        let ran = self.run_in_session(caller, id, held, request).await;
        *open
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        let (record, closes) = match ran {
            Ok(ran) => ran,
            Err(err) => {
                let _ = self.audit.set_session_status(id, "ready", false).await;
                return Err(err);
            }
        };
        let _ = self
            .audit
            .set_session_status(id, "ready", record.allow)
            .await;
        drop(guard);
        if let Some(reason) = closes {
            self.close_session(id, reason).await;
        }
        Ok(record)
    }

    /// Decide, record, run; says why the session must close, if it must.
    async fn run_in_session(
        self: &Arc<Self>,
        caller: &ApiKey,
        session_id: &str,
        held: &mut Held,
        request: SessionExecutionRequest,
    ) -> Result<(ExecutionRow, Option<&'static str>), AppError> {
        let files = self.checked_uploads(caller, &request.files).await?;
        let as_execution = ExecutionRequest {
            language: held.language.clone(),
            code: request.code,
            files: request.files,
            network: Vec::new(),
            mounts: Vec::new(),
            limits: RequestedLimits {
                timeout_ms: request.limits.timeout_ms,
                ..RequestedLimits::default()
            },
            labels: Default::default(),
            wait: true,
        };
        if as_execution.code.len() > super::request::MAX_CODE_BYTES {
            return Err(AppError::Invalid(format!(
                "code is {} bytes; the limit is {}",
                as_execution.code.len(),
                super::request::MAX_CODE_BYTES
            )));
        }
        let mut input = self.policy_input(caller, &as_execution, &files);
        input.request.kind = RequestKind::SessionExecution;
        input.request.session = Some(SessionInput {
            id: session_id.to_owned(),
            executions: held.executions,
            created_at: held.created_at.to_rfc3339(),
        });
        let policy = self.policy.current();
        let said = policy.state.decide(&input);
        let mut decision = said.clone();
        let allowed = self
            .enforce_floor(&held.language, &mut decision)
            .filter(|_| !decision.require_approval);
        // The session's limits stay those decided at creation; only the deadline is per call.
        let timeout_ms = allowed
            .as_ref()
            .map_or(0, |r| r.limits.timeout_ms)
            .min(held.runnable.limits.timeout_ms);
        let mut runnable = held.runnable.clone();
        runnable.limits.timeout_ms = timeout_ms;
        let mut row = super::executions::new_row(
            caller,
            &as_execution,
            &input,
            &decision,
            allowed.is_some().then_some(&runnable),
            (policy.state.revision(), &self.instance),
        );
        row.session_id = Some(session_id.to_owned());
        let event = NewEvent {
            kind: "execution.decision",
            execution_id: Some(row.id.clone()),
            key_id: Some(caller.id.clone()),
            tenant: Some(caller.tenant.clone()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(decision.allow && allowed.is_some()),
            reasons: json!(decision.reasons),
            input: json!(input),
            decision: json!(said),
            policy_revision: Some(row.policy_revision.clone()),
        };
        let live = self.live.track(&row.id);
        self.audit.record_execution_decision(&row, &event).await?;
        if allowed.is_none() {
            return Ok((row, None));
        }
        held.executions += 1;
        let ran = self
            .run_turn(&row, held, as_execution.code, files, &live, &runnable)
            .await;
        let closes = match &ran {
            Ok(ran) if ran.ending.session_lives() => None,
            Ok(TurnRan {
                ending: TurnEnding::Ended(Ending::Oom { .. }),
                ..
            }) => Some("oom"),
            _ => Some("crashed"),
        };
        let result = match &ran {
            Ok(TurnRan {
                ending: TurnEnding::Exited { result, .. },
                ..
            }) => result.clone(),
            _ => None,
        };
        let mut done = completion(ran);
        let output_dir = held.home.output.dir().to_owned();
        done.outputs = self
            .collect_session_output(output_dir, &row.id, runnable.limits.output_bytes)
            .await;
        let mut stored = self.complete_durably(row, done).await;
        if let Some(result) = result {
            if let Err(err) = self.audit.set_result(&stored.id, &result).await {
                tracing::warn!(execution_id = %stored.id, error = %err, "result not stored");
            }
            stored.result = Some(result);
        }
        drop(live);
        Ok((stored, closes))
    }

    /// `/output` as the execution left it, collected while the sandbox may still run
    /// (`outputs_live`: nothing the program can swap is followed).
    async fn collect_session_output(
        &self,
        src: std::path::PathBuf,
        execution_id: &str,
        budget: u64,
    ) -> Collected {
        let dest = self.outputs_root.join(execution_id);
        let collected = tokio::task::spawn_blocking(move || {
            crate::outputs_live::collect_live(&src, &dest, budget)
        })
        .await;
        match collected {
            Ok(Ok(collected)) => collected,
            Ok(Err(err)) => {
                tracing::error!(execution_id, error = %err, "collecting /output failed");
                Collected {
                    truncated: true,
                    skipped: vec![crate::outputs::Skipped {
                        path: String::new(),
                        bytes: None,
                        reason: "collection_failed".to_owned(),
                    }],
                    ..Collected::default()
                }
            }
            Err(err) => {
                tracing::error!(execution_id, error = %err, "collecting /output panicked");
                Collected {
                    truncated: true,
                    ..Collected::default()
                }
            }
        }
    }

    async fn run_turn(
        &self,
        row: &ExecutionRow,
        held: &mut Held,
        code: String,
        files: Vec<(String, Vec<u8>)>,
        live: &LiveGuard,
        runnable: &Runnable,
    ) -> Result<TurnRan, crate::runtime::RuntimeError> {
        let control = crate::runtime::RunControl {
            timeout: Duration::from_millis(runnable.limits.timeout_ms),
            output_cap: usize::try_from(runnable.limits.output_bytes).unwrap_or(usize::MAX),
            sink: None,
            cancel: live.cancel_token(),
        };
        if let Err(err) = self
            .audit
            .mark_running(
                &row.id,
                crate::ids::now_micros(),
                "warm",
                held.sandbox.name(),
            )
            .await
        {
            tracing::warn!(execution_id = %row.id, error = %err, "could not mark running");
        }
        held.sandbox
            .turn(turn_job(&held.language, &row.id, code, files), control)
            .await
    }
}

fn closed_conflict(id: &str, row: &SessionRow) -> AppError {
    AppError::Conflict(format!(
        "session {id} is closed ({})",
        row.closed_reason
            .as_deref()
            .unwrap_or("not open on this gateway")
    ))
}

/// Removes the sandbox and its host side; the slot and the live entry go with `held`.
async fn release(held: Held) {
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

/// The opening line: the session's environment and bridge.
fn opening_line(proxied: bool) -> Job<'static> {
    let mut env = sandbox_env();
    let proxy = proxied.then(|| {
        env.extend(crate::egress::proxy_env().map(|(k, v)| (k.to_owned(), v)));
        JobProxy {
            listen: crate::egress::SANDBOX_PROXY_LISTEN.to_owned(),
            socket: crate::egress::SANDBOX_SOCKET.to_owned(),
        }
    });
    Job {
        argv: vec!["session".to_owned()],
        cwd: Some(crate::runtime::WORKSPACE.to_owned()),
        env: Some(env),
        files: Vec::new(),
        proxy,
        exit_nonce: None,
    }
}

/// A turn: the cell under `/tmp/sandgate-cells/` (named by the execution), the uploads in
/// `/workspace`.
fn turn_job(
    language: &str,
    execution_id: &str,
    code: String,
    files: Vec<(String, Vec<u8>)>,
) -> Job<'static> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let ext = if language == "python" { "py" } else { "sh" };
    let cell = format!("/tmp/sandgate-cells/{execution_id}.{ext}");
    let mut job_files = vec![JobFile {
        path: cell.clone(),
        content_b64: b64.encode(code.as_bytes()).into(),
        mode: Some(0o644),
    }];
    job_files.extend(files.into_iter().map(|(name, content)| JobFile {
        path: format!("{}/{name}", crate::runtime::WORKSPACE),
        content_b64: b64.encode(content).into(),
        mode: Some(0o644),
    }));
    Job {
        argv: vec![cell],
        cwd: None,
        env: None,
        files: job_files,
        proxy: None,
        exit_nonce: None,
    }
}

/// The record's ending, from the turn's.
fn completion(ran: Result<TurnRan, crate::runtime::RuntimeError>) -> Completion {
    let mut done = Completion {
        status: "error",
        exit_code: None,
        duration_ms: 0,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        error: None,
        outputs: Collected::default(),
    };
    let ran = match ran {
        Ok(ran) => ran,
        Err(err) => {
            done.error = Some(err.to_string());
            return done;
        }
    };
    let (status, exit_code) = match ran.ending {
        TurnEnding::Exited { code: 0, .. } => ("succeeded", Some(0)),
        TurnEnding::Exited { code, .. } => ("failed", Some(i32::from(code))),
        TurnEnding::TimedOut { .. } => ("timeout", None),
        TurnEnding::Cancelled { .. } => ("cancelled", None),
        TurnEnding::Ended(Ending::Oom { .. }) => ("oom", None),
        TurnEnding::Ended(_) => ("killed", None),
    };
    done.status = status;
    done.exit_code = exit_code;
    done.duration_ms = i64::try_from(ran.duration.as_millis()).unwrap_or(i64::MAX);
    done.stdout_truncated = ran.stdout.truncated;
    done.stderr_truncated = ran.stderr.truncated;
    done.stdout = ran.stdout.bytes;
    done.stderr = ran.stderr.bytes;
    done
}
