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
    Decision, Environment, FileInput, HostPort, NetworkGrant, PolicyInput, Principal, RequestInput,
    RequestedLimits,
};

use super::floor::Runnable;
use super::reaper::LiveGuard;
use super::scheduler::Ticket;
use super::validate::{check_fields, decode_files};
use super::{error_chain, App, AppError};
use crate::audit::{ApiKey, Completion, ExecutionRow, NewEvent};
use crate::egress::{self, ExecutionEgress};
use crate::outputs::{Collected, OutputArea};
use crate::runtime::{JobFile, JobProxy, JobSpec, RunOutcome, RuntimeError, SandboxSpec};

/// Largest accepted program text.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
const COMPLETE_ATTEMPTS: u32 = 5;
/// How long (in 100 ms steps) a cancel request waits for the record to close.
const CANCEL_WAIT_STEPS: u32 = 100;
const WORKSPACE: &str = "/workspace";

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
        // A place in the queue before anything runs: a full queue refuses (429), and the
        // refusal is recorded with the decision (app::refusals).
        let ticket = match &runnable {
            Some(_) => match self.scheduler.admit(&caller.tenant) {
                Ok(ticket) => Some(ticket),
                Err(full) => {
                    let refusal = super::refusals::Refusal::QueueFull;
                    let held = (row, event);
                    return Err(self
                        .refuse_after_decision(held, refusal, full.to_string())
                        .await);
                }
            },
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

/// The interpreter and where the program text goes.
pub fn command_for(language: &str) -> (Vec<String>, &'static str) {
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
pub fn sandbox_env() -> BTreeMap<String, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_per_language() {
        assert_eq!(
            command_for("python").0,
            ["python3", "/tmp/sandgate/main.py"]
        );
        assert_eq!(command_for("bash").0, ["bash", "/tmp/sandgate/main.sh"]);
    }
}
