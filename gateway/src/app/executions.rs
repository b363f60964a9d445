//! The execution use case: decide -> audit (commit) -> run -> complete. This is the only path
//! to a sandbox, so no handler can run code without a committed decision.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::types::Json;
use tokio_util::sync::CancellationToken;

use policy_engine::{
    Decision, Environment, FileInput, HostPort, Limits, MountGrant, NetworkGrant, PolicyInput,
    Principal, Reason, RequestInput, RequestedLimits,
};

use super::reaper::LiveGuard;
use super::scheduler::Ticket;
use super::{error_chain, App, AppError};
use crate::audit::{ApiKey, Completion, ExecutionRow, NewEvent};
use crate::config::Ceilings;
use crate::egress::{self, ExecutionEgress};
use crate::outputs::{Collected, OutputArea};
use crate::runtime::{
    JobFile, JobProxy, JobSpec, ReadOnlyMount, RunOutcome, RuntimeError, SandboxSpec,
};

/// Largest accepted program text.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
const MAX_FILES: usize = 256;
/// Most labels, and most network destinations, in one request.
const MAX_LABELS: usize = 32;
const MAX_PATH_BYTES: usize = 255;
const COMPLETE_ATTEMPTS: u32 = 5;
/// How long (in 100 ms steps) a cancel request waits for the record to close.
const CANCEL_WAIT_STEPS: u32 = 100;
const WORKSPACE: &str = "/workspace";
/// Fewest pids a sandbox gets, whatever the policy says (see `clamp`).
pub const MIN_PIDS: u64 = 256;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRequest {
    pub language: String,
    pub code: String,
    #[serde(default)]
    pub files: Vec<FileUpload>,
    #[serde(default)]
    pub network: Vec<HostPort>,
    #[serde(default)]
    pub mounts: Vec<String>,
    #[serde(default)]
    pub limits: RequestedLimits,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default = "default_wait")]
    pub wait: bool,
}

fn default_wait() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpload {
    pub path: String,
    pub content_b64: String,
}

/// An allowed execution waiting for its slot.
#[derive(Debug)]
struct Pending {
    row: ExecutionRow,
    spec: SandboxSpec,
    network: Option<NetworkGrant>,
    live: LiveGuard,
    ticket: Ticket,
}

/// What became of a create request.
#[derive(Debug)]
pub enum Created {
    /// Ran to an end (any status): the final record.
    Finished(ExecutionRow),
    /// Runs in the background (`wait: false`).
    Accepted(ExecutionRow),
    Denied(ExecutionRow),
    /// Held for a reviewer (`pending_approval`); nothing runs until approved.
    PendingApproval {
        row: ExecutionRow,
        approval_id: String,
    },
}

/// An allowed decision, made concrete by the gateway: the floor it enforces whatever the policy
/// says (configured backend, configured image, limits under the ceilings). Stored with an
/// approval, it is exactly what a reviewer approves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Runnable {
    backend: String,
    runtime: String,
    image: String,
    limits: Limits,
    mounts: Vec<ReadOnlyMount>,
    /// The grant the egress proxy serves; `None`: no socket at all.
    network: Option<NetworkGrant>,
}

impl App {
    pub async fn create_execution(
        self: &Arc<Self>,
        caller: &ApiKey,
        request: ExecutionRequest,
    ) -> Result<Created, AppError> {
        let files = decode_files(&request.files)?;
        check_fields(&request)?;
        if request.code.len() > MAX_CODE_BYTES {
            return Err(AppError::Invalid(format!(
                "code is {} bytes; the limit is {MAX_CODE_BYTES}",
                request.code.len()
            )));
        }
        let input = self.policy_input(caller, &request, &files);
        let policy = self.policy.current();
        let revision = policy.state.revision();
        // The audit row keeps what the policy said (replay compares against it); the
        // execution row and the event's allow/reasons say what the gateway then did.
        let said = policy.state.decide(&input);
        let mut decision = said.clone();
        let runnable = self.enforce_floor(&request.language, &mut decision);

        let row = new_row(
            caller,
            &request,
            &input,
            &decision,
            runnable.as_ref(),
            (revision, &self.instance),
        );
        // Tracked before the commit, so the reaper never closes it while it is in flight.
        let live = self.live.track(&row.id);
        let event = NewEvent {
            kind: "execution.decision",
            execution_id: Some(row.id.clone()),
            key_id: Some(caller.id.clone()),
            tenant: Some(caller.tenant.clone()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(decision.allow),
            reasons: json!(decision.reasons),
            input: json!(input),
            decision: json!(said),
            policy_revision: Some(row.policy_revision.clone()),
        };
        // Sent to review: held (committed, fail closed), nothing runs until a reviewer approves.
        if let (Some(runnable), true) = (&runnable, decision.require_approval) {
            let held = (row, event);
            let (row, approval_id) = self
                .hold_for_review(caller, &request, &input, held, runnable)
                .await?;
            return Ok(Created::PendingApproval { row, approval_id });
        }
        // A place in the queue before anything is recorded: a full queue refuses (429) cleanly.
        let ticket = match &runnable {
            Some(_) => Some(
                self.scheduler
                    .admit(&caller.tenant)
                    .map_err(|full| AppError::RateLimited(full.to_string()))?,
            ),
            None => None,
        };
        // Fail closed: without a committed decision nothing runs.
        self.audit.record_execution_decision(&row, &event).await?;
        tracing::info!(execution_id = %row.id, allow = decision.allow, "decision recorded");

        let (Some(runnable), Some(ticket)) = (runnable, ticket) else {
            return Ok(Created::Denied(row));
        };
        let network = runnable.network.clone();
        let mut spec = self.sandbox_spec(&row.id, &request, files, runnable);
        spec.cancel = live.cancel_token();
        spec.sink = Some(self.streams.open(&row.id));
        let pending = Pending {
            row: row.clone(),
            spec,
            network,
            live,
            ticket,
        };
        let app = Arc::clone(self);
        let task = self
            .tasks
            .spawn(async move { app.run_and_complete(pending).await });
        if !request.wait {
            return Ok(Created::Accepted(row));
        }
        task.await
            .map(Created::Finished)
            .map_err(|err| AppError::Internal(format!("execution task failed: {err}")))
    }

    pub async fn get_execution(&self, caller: &ApiKey, id: &str) -> Result<ExecutionRow, AppError> {
        match self.audit.get_execution(id).await? {
            // Another tenant's execution is indistinguishable from a missing one.
            Some(row) if row.tenant == caller.tenant || caller.role != "agent" => Ok(row),
            _ => Err(AppError::NotFound),
        }
    }

    /// Stops a running execution (its sandbox is killed at once) and returns the final record.
    /// Cancelling one that has finished is a conflict.
    pub async fn cancel_execution(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<ExecutionRow, AppError> {
        let row = self.get_execution(caller, id).await?;
        if row.finished_at.is_some() {
            return Err(AppError::Conflict(format!(
                "execution {id} has already finished ({})",
                row.status
            )));
        }
        // Only what runs here can be cancelled: anything else is refused before it is recorded.
        if !self.live.contains(id) {
            return Err(AppError::Conflict(format!(
                "execution {id} is {} and not running on this gateway",
                row.status
            )));
        }
        let event = NewEvent {
            kind: "execution.cancel",
            execution_id: Some(id.to_owned()),
            key_id: Some(caller.id.clone()),
            // The execution's tenant: an admin of another tenant may cancel it.
            tenant: Some(row.tenant.clone()),
            decision_id: None,
            allow: Some(true),
            reasons: json!([]),
            input: json!({"requested_by": caller.id, "requested_by_tenant": caller.tenant}),
            decision: json!({"cancel": true}),
            policy_revision: None,
        };
        self.audit.record_event(&event).await?;
        if !self.live.cancel(id) {
            return Err(AppError::Conflict(format!(
                "execution {id} is not running on this gateway"
            )));
        }
        for _ in 0..CANCEL_WAIT_STEPS {
            let row = self.get_execution(caller, id).await?;
            if row.finished_at.is_some() {
                return Ok(row);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.get_execution(caller, id).await
    }

    fn policy_input(
        &self,
        caller: &ApiKey,
        request: &ExecutionRequest,
        files: &[(String, Vec<u8>)],
    ) -> PolicyInput {
        PolicyInput {
            principal: Principal {
                key_id: caller.id.clone(),
                tenant: caller.tenant.clone(),
                role: caller.role.clone(),
            },
            request: RequestInput {
                language: request.language.clone(),
                code_sha256: hex::encode(Sha256::digest(request.code.as_bytes())),
                code_bytes: request.code.len() as u64,
                files: files
                    .iter()
                    .map(|(path, content)| FileInput {
                        path: path.clone(),
                        bytes: content.len() as u64,
                    })
                    .collect(),
                network: request.network.clone(),
                mounts: request.mounts.clone(),
                limits: request.limits.clone(),
                labels: request.labels.clone(),
            },
            environment: Environment {
                backends: self.config.backends.keys().cloned().collect(),
                datasets: self.config.datasets.keys().cloned().collect(),
                now: crate::ids::now_micros().to_rfc3339(),
            },
        }
    }

    /// Turns an allow into something runnable, or into a deny with the gateway's reason. The
    /// floor holds whatever the policy returned; the recorded decision shows the clamped limits.
    fn enforce_floor(&self, language: &str, decision: &mut Decision) -> Option<Runnable> {
        if !decision.allow {
            return None;
        }
        match self.runnable(language, decision) {
            Ok(runnable) => {
                decision.limits = Some(runnable.limits.clone());
                Some(runnable)
            }
            Err(reason) => {
                decision.allow = false;
                decision.reasons.push(reason);
                None
            }
        }
    }

    fn runnable(&self, language: &str, decision: &Decision) -> Result<Runnable, Reason> {
        let refuse = |code: &str, message: String| {
            Err(Reason {
                code: code.to_owned(),
                message,
            })
        };
        let network = decision
            .network
            .as_ref()
            .filter(|grant| !grant.allow.is_empty())
            .cloned();
        if network.is_some() && self.egress.is_none() {
            return refuse(
                "network.unavailable",
                "the policy grants network access but this gateway's egress proxy is not running"
                    .into(),
            );
        }
        let (Some(backend), Some(limits)) = (&decision.backend, &decision.limits) else {
            return refuse(
                "policy.error",
                "an allow decision must name a backend and set limits".into(),
            );
        };
        let Some(runtime) = self.config.backends.get(backend) else {
            return refuse(
                "backend.unavailable",
                format!("backend {backend:?} is not configured in this gateway"),
            );
        };
        let Some(image) = self.config.images.get(language) else {
            return refuse(
                "language.unavailable",
                format!("no sandbox image is configured for language {language:?}"),
            );
        };
        let mut limits = limits.clone();
        clamp(&mut limits, &self.config.ceilings);
        let mounts = decision
            .mounts
            .iter()
            .map(|grant| self.dataset_mount(grant))
            .collect::<Result<_, _>>()?;
        Ok(Runnable {
            backend: backend.clone(),
            runtime: runtime.runtime.clone(),
            image: image.clone(),
            limits,
            mounts,
            network,
        })
    }

    /// A granted dataset as a read-only mount: the dataset must be configured, the target a
    /// plain absolute path under `/data/`. Writable mounts are never granted.
    fn dataset_mount(&self, grant: &MountGrant) -> Result<ReadOnlyMount, Reason> {
        let refuse = |code: &str, message: String| Reason {
            code: code.to_owned(),
            message,
        };
        let Some(dataset) = self.config.datasets.get(&grant.dataset) else {
            return Err(refuse(
                "mount.unavailable",
                format!(
                    "dataset {:?} is not configured in this gateway",
                    grant.dataset
                ),
            ));
        };
        if !grant.read_only {
            return Err(refuse(
                "mount.read_only",
                format!("dataset {:?} can only be mounted read-only", grant.dataset),
            ));
        }
        let target = &grant.target;
        let plain = target.strip_prefix("/data/").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .split('/')
                    .all(|part| !part.is_empty() && part != "." && part != "..")
                && !rest.chars().any(char::is_control)
        });
        if !plain {
            return Err(refuse(
                "policy.error",
                format!("mount target {target:?} must be a plain path under /data/"),
            ));
        }
        Ok(ReadOnlyMount {
            source: dataset.path.clone(),
            target: target.clone(),
        })
    }

    fn sandbox_spec(
        &self,
        id: &str,
        request: &ExecutionRequest,
        files: Vec<(String, Vec<u8>)>,
        runnable: Runnable,
    ) -> SandboxSpec {
        let (argv, program) = command_for(&request.language);
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut job_files = vec![JobFile {
            path: program.to_owned(),
            content_b64: b64.encode(request.code.as_bytes()),
            // Executable: languages without an interpreter run the file itself.
            mode: 0o755,
        }];
        job_files.extend(files.into_iter().map(|(path, content)| JobFile {
            path: format!("{WORKSPACE}/{path}"),
            content_b64: b64.encode(content),
            mode: 0o644,
        }));
        SandboxSpec {
            execution_id: id.to_owned(),
            instance: self.instance.clone(),
            image: runnable.image,
            runtime: runnable.runtime,
            init_binary: self.init_binary.clone(),
            limits: runnable.limits,
            mounts: runnable.mounts,
            egress_dir: None,
            output_dir: None,
            sink: None,
            cancel: CancellationToken::new(),
            job: JobSpec {
                argv,
                cwd: WORKSPACE.to_owned(),
                env: sandbox_env(),
                files: job_files,
                proxy: None,
                exit_nonce: None,
            },
        }
    }

    /// Whether a decision made runnable earlier (and reviewed since) still fits this gateway's
    /// configuration, which may have changed while it waited (a restart, a lowered ceiling, a
    /// removed backend, image or dataset). What was reviewed is never silently changed: a
    /// mismatch is refused, and the reviewer can reject or the agent ask again.
    pub(super) fn still_runnable(&self, runnable: &Runnable) -> Result<(), String> {
        let runtime_ok = self
            .config
            .backends
            .get(&runnable.backend)
            .is_some_and(|backend| backend.runtime == runnable.runtime);
        if !runtime_ok {
            return Err(format!(
                "backend {:?} (runtime {:?}) is no longer configured",
                runnable.backend, runnable.runtime
            ));
        }
        if !self
            .config
            .images
            .values()
            .any(|image| image == &runnable.image)
        {
            return Err(format!(
                "image {:?} is no longer configured",
                runnable.image
            ));
        }
        let mut limits = runnable.limits.clone();
        clamp(&mut limits, &self.config.ceilings);
        if limits != runnable.limits {
            return Err("the configured ceilings are now lower than the reviewed limits".into());
        }
        for mount in &runnable.mounts {
            if !self
                .config
                .datasets
                .values()
                .any(|d| d.path == mount.source)
            {
                return Err(format!(
                    "the dataset mounted at {} is no longer configured",
                    mount.target
                ));
            }
        }
        if runnable.network.is_some() && self.egress.is_none() {
            return Err("the egress proxy is not running".into());
        }
        Ok(())
    }

    /// Runs a stored, approved execution with its reviewed decision, through the queue.
    pub(super) fn launch_reviewed(
        self: &Arc<Self>,
        row: ExecutionRow,
        request: &ExecutionRequest,
        files: Vec<(String, Vec<u8>)>,
        runnable: Runnable,
        live: LiveGuard,
        ticket: Ticket,
    ) {
        let network = runnable.network.clone();
        let mut spec = self.sandbox_spec(&row.id, request, files, runnable);
        spec.cancel = live.cancel_token();
        spec.sink = Some(self.streams.open(&row.id));
        let pending = Pending {
            row,
            spec,
            network,
            live,
            ticket,
        };
        let app = Arc::clone(self);
        self.tasks
            .spawn(async move { app.run_and_complete(pending).await });
    }

    async fn run_and_complete(&self, pending: Pending) -> ExecutionRow {
        let Pending {
            row,
            spec,
            network,
            live,
            ticket,
        } = pending;
        let id = row.id.clone();
        let done = match ticket.slot().await {
            Some(_slot) => {
                live.started(spec.timeout());
                if let Err(err) = self.audit.mark_running(&id, crate::ids::now_micros()).await {
                    tracing::warn!(execution_id = %id, error = %err, "could not mark running");
                }
                let tenant = row.tenant.clone();
                self.run_collecting(spec, &tenant, network).await
            }
            None => completion(
                Err(RuntimeError::Unavailable(
                    "the gateway is shutting down".to_owned(),
                )),
                &id,
            ),
        };
        let stored = self.complete_with_retry(row, done).await;
        // Subscribers get the end only once the record is stored: a late reader of the record
        // sees the same thing the stream said.
        if let Some(stream) = self.streams.get(&id) {
            stream.close(exit_summary(&stored));
        }
        self.streams.remove(&id);
        stored
    }

    /// Runs the sandbox with its own `/output` area, then collects what the program left there
    /// (up to the output limit) once the sandbox is gone, and unmounts the area.
    async fn run_collecting(
        &self,
        mut spec: SandboxSpec,
        tenant: &str,
        network: Option<NetworkGrant>,
    ) -> Completion {
        let id = spec.execution_id.clone();
        let budget = spec.limits.output_bytes;
        let area = match OutputArea::create(&self.scratch_root, &id, spec.limits.disk_mb) {
            Ok(area) => area,
            Err(err) => {
                let err = RuntimeError::Unavailable(format!("preparing /output: {err}"));
                return completion(Err(err), &id);
            }
        };
        spec.output_dir = Some(area.dir().to_owned());
        let outcome = self.run_with_egress(spec, tenant, network).await;
        // Collect only from a sandbox confirmed gone: one still running could swap a directory
        // for a symlink while the gateway walks it.
        let collectable = matches!(&outcome, Ok(run) if run.removed);
        let mut done = completion(outcome, &id);
        let dest = self.outputs_root.join(&id);
        let collected = tokio::task::spawn_blocking(move || {
            let collected = if collectable {
                area.collect(&dest, budget)
            } else {
                Err(std::io::Error::other(
                    "the sandbox was not confirmed removed; /output not collected",
                ))
            };
            if let Err(err) = area.remove() {
                tracing::warn!(error = %err, "output area left behind for the sweep");
            }
            collected
        })
        .await;
        match collected {
            Ok(Ok(outputs)) => done.outputs = outputs,
            Ok(Err(err)) => {
                tracing::error!(execution_id = %id, error = %err, "collecting /output failed");
                done.outputs.truncated = true;
                done.outputs.skipped.push(crate::outputs::Skipped {
                    path: String::new(),
                    bytes: None,
                    reason: "collection_failed".to_owned(),
                });
            }
            Err(err) => {
                tracing::error!(execution_id = %id, error = %err, "collecting /output panicked");
                done.outputs.truncated = true;
            }
        }
        done
    }

    /// Runs the sandbox; with a network grant, behind its own egress socket for exactly as
    /// long as the sandbox lives.
    async fn run_with_egress(
        &self,
        mut spec: SandboxSpec,
        tenant: &str,
        network: Option<NetworkGrant>,
    ) -> Result<RunOutcome, RuntimeError> {
        let (Some(grant), Some(proxy)) = (network, self.egress.as_ref()) else {
            return self.runtime.run(spec).await;
        };
        let egress = ExecutionEgress::start(
            proxy,
            &self.egress_root,
            &spec.execution_id,
            tenant,
            &grant,
            self.shutdown.child_token(),
        )
        .map_err(|err| RuntimeError::Unavailable(error_chain(&err)))?;
        spec.egress_dir = Some(egress.dir.clone());
        spec.job.proxy = Some(JobProxy {
            listen: egress::SANDBOX_PROXY_LISTEN.to_owned(),
            socket: egress::SANDBOX_SOCKET.to_owned(),
        });
        spec.job
            .env
            .extend(egress::proxy_env().map(|(k, v)| (k.to_owned(), v)));
        let outcome = self.runtime.run(spec).await;
        egress.finish().await;
        outcome
    }

    /// Completion is retried; if the store stays down the caller still gets the truth, and the
    /// row stays `running` for the reconciler.
    async fn complete_with_retry(&self, row: ExecutionRow, done: Completion) -> ExecutionRow {
        for attempt in 1..=COMPLETE_ATTEMPTS {
            match self.audit.complete_execution(&row.id, &done).await {
                Ok(stored) => return stored,
                Err(err) => {
                    tracing::warn!(execution_id = %row.id, attempt, error = %err, "completing execution failed");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
            }
        }
        tracing::error!(execution_id = %row.id, "execution result not stored");
        ExecutionRow {
            status: done.status.to_owned(),
            exit_code: done.exit_code,
            duration_ms: Some(done.duration_ms),
            stdout: Some(done.stdout),
            stderr: Some(done.stderr),
            stdout_truncated: done.stdout_truncated,
            stderr_truncated: done.stderr_truncated,
            error: done.error,
            outputs: Json(json!(done.outputs.files)),
            outputs_skipped: Json(json!(done.outputs.skipped)),
            outputs_truncated: done.outputs.truncated,
            ..row
        }
    }
}

/// What the `exit` event of a stream carries: how the execution ended.
pub fn exit_summary(row: &ExecutionRow) -> serde_json::Value {
    json!({
        "status": row.status,
        "exit_code": row.exit_code,
        "duration_ms": row.duration_ms,
        "stdout_truncated": row.stdout_truncated,
        "stderr_truncated": row.stderr_truncated,
        "outputs": row.outputs.0,
        "outputs_truncated": row.outputs_truncated,
    })
}

fn completion(outcome: Result<RunOutcome, RuntimeError>, id: &str) -> Completion {
    match outcome {
        Ok(run) => {
            let mut error = None;
            let status = if run.cancelled {
                "cancelled"
            } else if run.timed_out {
                "timeout"
            } else if run.oom_killed {
                "oom"
            } else if run.init_exit.is_none() {
                // sandbox-init never reported an end: the sandbox died under the program.
                error = Some(format!(
                    "the sandbox stopped before its program ended (container exit {:?}); \
                     its kernel gave up (e.g. a fork bomb at the pids limit) or it was killed",
                    run.exit_code
                ));
                tracing::warn!(execution_id = %id, exit = ?run.exit_code, "sandbox died under its program");
                "killed"
            } else if run.init_exit == Some(0) {
                "succeeded"
            } else {
                "failed"
            };
            Completion {
                status,
                exit_code: run
                    .init_exit
                    .or(run.exit_code)
                    .and_then(|code| i32::try_from(code).ok()),
                duration_ms: i64::try_from(run.duration.as_millis()).unwrap_or(i64::MAX),
                stdout: run.stdout.text(),
                stderr: run.stderr.text(),
                stdout_truncated: run.stdout.truncated,
                stderr_truncated: run.stderr.truncated,
                error,
                outputs: Collected::default(),
            }
        }
        Err(err) => {
            tracing::error!(execution_id = %id, error = %err, "sandbox failed");
            Completion {
                status: "error",
                exit_code: None,
                duration_ms: 0,
                stdout: String::new(),
                stderr: String::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                error: Some(err.to_string()),
                outputs: Collected::default(),
            }
        }
    }
}

fn new_row(
    caller: &ApiKey,
    request: &ExecutionRequest,
    input: &PolicyInput,
    decision: &Decision,
    runnable: Option<&Runnable>,
    (policy_revision, instance): (&str, &str),
) -> ExecutionRow {
    let now = crate::ids::now_micros();
    ExecutionRow {
        id: crate::ids::new("ex"),
        tenant: caller.tenant.clone(),
        key_id: caller.id.clone(),
        language: request.language.clone(),
        code_sha256: input.request.code_sha256.clone(),
        code_bytes: i64::try_from(request.code.len()).unwrap_or(i64::MAX),
        labels: Json(json!(request.labels)),
        status: if runnable.is_some() {
            "queued"
        } else {
            "denied"
        }
        .to_owned(),
        decision_id: crate::ids::new("dc"),
        allow: decision.allow,
        reasons: Json(decision.reasons.clone()),
        backend: runnable.map(|r| r.backend.clone()),
        runtime: runnable.map(|r| r.runtime.clone()),
        image: runnable.map(|r| r.image.clone()),
        limits: runnable.map(|r| Json(r.limits.clone())),
        policy_revision: policy_revision.to_owned(),
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
    }
}

/// Lowers every limit to its ceiling.
fn clamp(limits: &mut Limits, ceilings: &Ceilings) {
    limits.timeout_ms = limits.timeout_ms.clamp(1, ceilings.timeout_ms);
    limits.memory_mb = limits.memory_mb.clamp(16, ceilings.memory_mb);
    limits.cpus = limits.cpus.clamp(0.01, ceilings.cpus);
    // The pids cgroup also counts gVisor's own threads (44 for an idle sandbox, measured):
    // below this floor sandboxes die at random.
    limits.pids = limits.pids.clamp(MIN_PIDS, ceilings.pids.max(MIN_PIDS));
    limits.disk_mb = limits.disk_mb.clamp(1, ceilings.disk_mb);
    limits.output_bytes = limits.output_bytes.min(ceilings.output_bytes);
}

/// The interpreter and where the program text goes.
fn command_for(language: &str) -> (Vec<String>, &'static str) {
    let (interpreter, program) = match language {
        "python" => ("python3", "/tmp/sandgate/main.py"),
        "bash" => ("bash", "/tmp/sandgate/main.sh"),
        // Anything else the policy allowed and an image exists for: run the file as given.
        _ => ("/tmp/sandgate/main", "/tmp/sandgate/main"),
    };
    let argv = if interpreter == program {
        vec![program.to_owned()]
    } else {
        vec![interpreter.to_owned(), program.to_owned()]
    };
    (argv, program)
}

/// The whole environment of the sandboxed program. Nothing of the gateway's own leaks in.
fn sandbox_env() -> BTreeMap<String, String> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MPLBACKEND", "Agg"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Bounds and checks the request's free-text fields before they reach the policy input and the
/// audit rows (PostgreSQL's jsonb refuses NUL, and nothing else should carry control
/// characters either).
fn check_fields(request: &ExecutionRequest) -> Result<(), AppError> {
    let text = |what: &str, value: &str, max: usize| {
        if value.len() > max || value.chars().any(char::is_control) {
            return Err(AppError::Invalid(format!(
                "{what} must be at most {max} bytes without control characters"
            )));
        }
        Ok(())
    };
    text("language", &request.language, 32)?;
    if request.labels.len() > MAX_LABELS || request.network.len() > MAX_LABELS {
        return Err(AppError::Invalid(format!(
            "at most {MAX_LABELS} labels and {MAX_LABELS} network destinations"
        )));
    }
    for (key, value) in &request.labels {
        text("a label key", key, 63)?;
        text("a label value", value, 256)?;
    }
    for destination in &request.network {
        text("a network host", &destination.host, 253)?;
    }
    for mount in &request.mounts {
        text("a mount", mount, 128)?;
    }
    Ok(())
}

/// Decodes uploads and checks their names: relative, inside `/workspace`, bounded.
pub(super) fn decode_files(files: &[FileUpload]) -> Result<Vec<(String, Vec<u8>)>, AppError> {
    if files.len() > MAX_FILES {
        return Err(AppError::Invalid(format!(
            "{} files; the limit is {MAX_FILES}",
            files.len()
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut seen = std::collections::HashSet::new();
    files
        .iter()
        .map(|file| {
            let path = normalise_path(&file.path)?;
            if !seen.insert(path.clone()) {
                return Err(AppError::Invalid(format!(
                    "file {:?}: given more than once",
                    file.path
                )));
            }
            let content = b64.decode(&file.content_b64).map_err(|err| {
                AppError::Invalid(format!("file {:?}: content_b64: {err}", file.path))
            })?;
            Ok((path, content))
        })
        .collect()
}

/// The name a file is written under: its NFC form, once that form, its compatibility (NFKC)
/// form and its percent-decoded form all pass [`check_path`]. So look-alikes (fullwidth dots
/// and slashes) and encoded separators (`%2e%2e/x`) cannot smuggle a traversal past the check
/// into something that later normalises or decodes it.
fn normalise_path(path: &str) -> Result<String, AppError> {
    use unicode_normalization::UnicodeNormalization;
    let nfc: String = path.nfc().collect();
    let nfkc: String = path.nfkc().collect();
    let decoded = percent_decode(&nfkc);
    for form in [&nfc, &nfkc, &decoded] {
        check_path(form).map_err(|why| AppError::Invalid(format!("file {path:?}: {why}")))?;
    }
    Ok(nfc)
}

/// `%XX` sequences decoded (lossily); anything else kept.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn check_path(path: &str) -> Result<(), String> {
    let bad = |why: &str| Err(why.to_owned());
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return bad("path must be 1 to 255 bytes");
    }
    if path.starts_with('/') {
        return bad("path must be relative to /workspace");
    }
    if path.chars().any(char::is_control) {
        return bad("path must not contain control characters");
    }
    if path.contains('\\') {
        return bad("path must not contain a backslash");
    }
    if path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("path must not contain empty, '.' or '..' components");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            timeout_ms: 999_999,
            memory_mb: 99_999,
            cpus: 64.0,
            pids: 1,
            disk_mb: 99_999,
            output_bytes: u64::MAX,
        }
    }

    #[test]
    fn limits_are_clamped_to_ceilings_and_floor() {
        let mut l = limits();
        let ceilings = Ceilings::default();
        clamp(&mut l, &ceilings);
        assert_eq!(l.timeout_ms, ceilings.timeout_ms);
        assert_eq!(l.memory_mb, ceilings.memory_mb);
        assert_eq!(l.cpus, ceilings.cpus);
        assert_eq!(l.pids, MIN_PIDS);
        assert_eq!(l.disk_mb, ceilings.disk_mb);
        assert_eq!(l.output_bytes, ceilings.output_bytes);
    }

    #[test]
    fn file_paths_are_checked() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a\0b",
            "a\nb",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["data.csv", "src/main.py", "a.b/c"] {
            assert!(check_path(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn file_names_are_checked_after_normalisation_and_decoding() {
        for bad in [
            "\u{ff0e}\u{ff0e}/x",   // fullwidth dots
            "a\u{ff0f}..\u{ff0f}b", // fullwidth slashes
            "%2e%2e/x",
            "%2E%2E%2Fetc",
            "a%2f..%2f..%2fb",
            "x%00y",
            "..\\x",
            "\u{2024}\u{2024}/x", // one-dot leaders: NFKC gives '.'
        ] {
            assert!(normalise_path(bad).is_err(), "{bad:?} accepted");
        }
        // Decomposed é is stored composed (NFC), and plain percent signs are fine.
        assert_eq!(normalise_path("cafe\u{301}.csv").unwrap(), "caf\u{e9}.csv");
        assert_eq!(normalise_path("100%.txt").unwrap(), "100%.txt");
    }

    #[test]
    fn commands_per_language() {
        assert_eq!(
            command_for("python").0,
            ["python3", "/tmp/sandgate/main.py"]
        );
        assert_eq!(command_for("bash").0, ["bash", "/tmp/sandgate/main.sh"]);
    }
}
