//! The one launch path. Every execution that may run (allowed at once, approved by a reviewer)
//! comes here with its committed decision: wait for a slot -> a sandbox (claimed from the warm
//! pool, or started cold) -> its grant served in the sandbox's socket directory -> the job
//! handed over and run -> `/output` collected once nothing of the program runs any more (the
//! init's authenticated end, or dockerd says the sandbox stopped) -> the record completed -> the
//! event stream closed; the container is removed in the background, off the answer's path (the
//! reaper removes what that misses).

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::json;
use sqlx::types::Json;
use tokio::task::JoinHandle;

use super::floor::Runnable;
use super::home::SandboxHome;
use super::pool::{Claimed, PoolKey, Serves, Shape};
use super::reaper::LiveGuard;
use super::scheduler::Ticket;
use super::stream::Stream;
use super::{error_chain, App};
use crate::audit::durable::Durable;
use crate::audit::{Completion, ExecutionRow};
use crate::egress::{self, ExecutionEgress};
use crate::outputs::Collected;
use crate::runtime::{
    Ending, Job, JobFile, JobProxy, Owner, Ran, RunControl, RuntimeError, SandboxPlan,
    SessionRunner, Waits, WORKSPACE,
};
use crate::status::ExecutionStatus;

/// What the agent sent that the sandbox runs.
#[derive(Debug)]
pub(super) struct Program {
    pub language: String,
    pub code: String,
    /// Checked upload names (relative to `/workspace`) and contents.
    pub files: Vec<(String, Vec<u8>)>,
}

/// An execution whose decision is committed, waiting for its slot.
#[derive(Debug)]
pub(super) struct Launch {
    pub row: ExecutionRow,
    pub program: Program,
    pub runnable: Runnable,
    pub live: LiveGuard,
    pub ticket: Ticket,
}

/// How the execution got its sandbox (`start` in the record).
pub use api_types::SandboxStart as Start;

impl App {
    /// Runs the execution in a task of its own (a dropped HTTP request cannot abandon it);
    /// the task's result is the final record.
    pub(super) fn launch(self: &Arc<Self>, launch: Launch) -> JoinHandle<ExecutionRow> {
        let stream = self.streams.open(&launch.row.id);
        let app = Arc::clone(self);
        self.tasks
            .spawn(async move { app.run_launched(launch, stream).await })
    }

    async fn run_launched(&self, launch: Launch, stream: Arc<Stream>) -> ExecutionRow {
        let Launch {
            row,
            program,
            runnable,
            live,
            ticket,
        } = launch;
        let id = row.id.clone();
        let done = match ticket.slot().await {
            Some(_slot) => {
                let control = RunControl {
                    timeout: std::time::Duration::from_millis(runnable.limits.timeout_ms),
                    output_cap: usize::try_from(runnable.limits.output_bytes).unwrap_or(usize::MAX),
                    sink: Some(stream),
                    cancel: live.cancel_token(),
                };
                self.run_in_sandbox(&row, program, runnable, (control, &live))
                    .await
            }
            None => failed(
                &id,
                &RuntimeError::Unavailable("the gateway is shutting down".into()),
            ),
        };
        self.save_stream_layout(&id).await;
        self.share_outputs(&id, &done.outputs).await;
        let stored = self.complete_durably(row, done).await;
        // Subscribers get the end only once the record is stored: a late reader of the record
        // sees the same thing the stream said.
        if let Some(stream) = self.streams.get(&id) {
            stream.close(super::executions::exit_summary(&stored));
        }
        self.streams.remove(&id);
        stored
    }

    /// A sandbox, the grant, the run, the collection.
    async fn run_in_sandbox(
        &self,
        row: &ExecutionRow,
        program: Program,
        runnable: Runnable,
        (control, live): (RunControl, &LiveGuard),
    ) -> Completion {
        let (claimed, start) = match self
            .sandbox_for(&row.id, &program.language, &runnable)
            .await
        {
            Ok(got) => got,
            Err(err) => return failed(&row.id, &err),
        };
        let Claimed { mut sandbox, home } = claimed;
        if let Err(err) = self
            .audit
            .mark_running(&row.id, crate::ids::now_micros(), start, sandbox.name())
            .await
        {
            tracing::warn!(execution_id = %row.id, error = %err, "could not mark running");
        }
        let egress = match self.serve_grant(row, &runnable, &home) {
            Ok(egress) => egress,
            Err(err) => {
                sandbox.discard().await;
                home.remove();
                return failed(&row.id, &err);
            }
        };
        // The reaper's deadline counts from here, not from a slow cold start.
        live.started(control.timeout);
        let job = job_for(program, runnable.limits.cpus, egress.as_ref());
        let ran = sandbox.run(job, control).await;
        if let Some(egress) = egress {
            egress.finish().await;
        }
        let collectable = matches!(&ran, Ok(ran) if ran.settled);
        if collectable {
            // Nothing runs in it any more: removing it need not delay the answer.
            self.tasks.spawn(sandbox.discard());
        } else {
            sandbox.discard().await;
        }
        let special_files = ran
            .as_ref()
            .map(|ran| ran.special_files.clone())
            .unwrap_or_default();
        let mut done = completion(ran, &row.id);
        done.outputs = collect(
            home,
            collectable,
            &self.outputs_root.join(&row.id),
            runnable.limits.output_bytes,
        )
        .await;
        crate::outputs::add_special_files(&mut done.outputs, &special_files);
        done
    }

    /// A pooled sandbox of exactly this decision's key, or a cold one started now.
    async fn sandbox_for(
        &self,
        execution_id: &str,
        language: &str,
        runnable: &Runnable,
    ) -> Result<(Claimed, Start), RuntimeError> {
        let key = PoolKey::of(language, Serves::Execution, runnable);
        if let Some(claimed) = self.pool.claim(&key).await {
            return Ok((claimed, Start::Warm));
        }
        let cold = self.start_cold(execution_id, runnable, Waits::Init).await?;
        Ok((cold, Start::Cold))
    }

    /// A session's sandbox (its runner waiting for the opening line): a pooled one of exactly
    /// this decision's key, or a cold one started now. The session's one call into the pool.
    pub(super) async fn session_sandbox(
        &self,
        session_id: &str,
        runner: SessionRunner,
        language: &str,
        runnable: &Runnable,
    ) -> Result<(Claimed, Start), RuntimeError> {
        let key = PoolKey::of(language, Serves::Session, runnable);
        if let Some(claimed) = self.pool.claim(&key).await {
            return Ok((claimed, Start::Warm));
        }
        let cold = self
            .start_cold(session_id, runnable, Waits::Session(runner))
            .await?;
        Ok((cold, Start::Cold))
    }

    /// A sandbox started now for this decision, with its dataset mounts.
    async fn start_cold(
        &self,
        id: &str,
        runnable: &Runnable,
        waits: Waits,
    ) -> Result<Claimed, RuntimeError> {
        let shape = Shape::of(runnable);
        let home = SandboxHome::create(
            &self.egress_root,
            &self.scratch_root,
            id,
            shape.limits.disk_mb,
        )
        .map_err(|err| RuntimeError::Unavailable(format!("preparing the sandbox: {err}")))?;
        let mut plan = self.plan(id, Owner::Execution(id.to_owned()), &shape, &home, waits);
        plan.mounts.clone_from(&runnable.mounts);
        match self.runtime.start(plan).await {
            Ok(sandbox) => Ok(Claimed { sandbox, home }),
            Err(err) => {
                home.remove();
                Err(err)
            }
        }
    }

    /// The sandbox a shape becomes (no dataset mounts: the caller adds a decision's).
    pub(super) fn plan(
        &self,
        id: &str,
        owner: Owner,
        shape: &Shape,
        home: &SandboxHome,
        waits: Waits,
    ) -> SandboxPlan {
        SandboxPlan {
            id: id.to_owned(),
            owner,
            instance: self.instance.clone(),
            image: shape.image.clone(),
            runtime: shape.runtime.clone(),
            init_binary: self.init_binary.clone(),
            limits: shape.limits.clone(),
            mounts: Vec::new(),
            egress_dir: home.egress_dir.clone(),
            output_dir: home.output.dir().to_owned(),
            env: sandbox_env(shape.limits.cpus),
            waits,
        }
    }

    /// The execution's own listener in the sandbox's socket directory, for exactly as long as
    /// the run: with its grant, or without one (every attempt refused `egress.no_grant`).
    fn serve_grant(
        &self,
        row: &ExecutionRow,
        runnable: &Runnable,
        home: &SandboxHome,
    ) -> Result<Option<ExecutionEgress>, RuntimeError> {
        let Some(proxy) = self.egress.as_ref() else {
            return Ok(None);
        };
        ExecutionEgress::start(
            proxy,
            &home.egress_dir,
            &row.id,
            &row.tenant,
            runnable.network.as_ref(),
            self.shutdown.child_token(),
        )
        .map(Some)
        .map_err(|err| RuntimeError::Unavailable(error_chain(&err)))
    }

    /// Stored, or journaled under the data directory while PostgreSQL is away (replayed when it
    /// returns); either way the caller gets the truth.
    pub(super) async fn complete_durably(
        &self,
        row: ExecutionRow,
        done: Completion,
    ) -> ExecutionRow {
        match self.audit.complete_durably(&row.id, &done).await {
            Ok(Durable::Stored(stored)) => return stored,
            Ok(Durable::Journaled) => {}
            Err(err) => {
                tracing::error!(execution_id = %row.id, error = %error_chain(&err), "execution result not stored");
            }
        }
        ExecutionRow {
            status: done.status,
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

/// Copies what the program left in `/output` (only once nothing of the program runs: a program
/// still running could swap a directory for a symlink while the gateway walks it), then
/// removes the sandbox's host side.
async fn collect(
    home: SandboxHome,
    collectable: bool,
    dest: &std::path::Path,
    budget: u64,
) -> Collected {
    let dest = dest.to_owned();
    let collected = tokio::task::spawn_blocking(move || {
        let collected = if collectable {
            home.output.collect(&dest, budget)
        } else {
            Err(std::io::Error::other(
                "the program was not confirmed gone; /output not collected",
            ))
        };
        home.remove();
        collected
    })
    .await;
    match collected {
        Ok(Ok(outputs)) => outputs,
        Ok(Err(err)) => {
            tracing::error!(error = %err, "collecting /output failed");
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
            tracing::error!(error = %err, "collecting /output panicked");
            Collected {
                truncated: true,
                ..Collected::default()
            }
        }
    }
}

/// The job line for a program: the program itself in `/workspace` (so it is the program's
/// directory and its siblings import), the uploads beside it, the environment, the bridge, and
/// for inspected destinations the trust bundle and credential placeholders.
fn job_for(program: Program, cpus: f64, egress: Option<&ExecutionEgress>) -> Job<'static> {
    let (argv, path) = command_for(&program.language);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut files = vec![JobFile {
        path: path.to_owned(),
        content_b64: b64.encode(program.code.as_bytes()).into(),
        // Executable: languages without an interpreter run the file itself.
        mode: Some(0o755),
    }];
    files.extend(program.files.into_iter().map(|(name, content)| JobFile {
        path: format!("{WORKSPACE}/{name}"),
        content_b64: b64.encode(content).into(),
        mode: Some(0o644),
    }));
    let mut env = sandbox_env(cpus);
    let proxy = egress.map(|egress| with_egress(egress, &mut env, &mut files));
    Job {
        argv,
        cwd: Some(WORKSPACE.to_owned()),
        env: Some(env),
        files,
        proxy,
        exit_nonce: None,
    }
}

/// What a sandbox needs of its listener (granted or not): the proxy's variables, for inspected
/// destinations the trust bundle and credential placeholders, and the bridge to its socket.
pub(super) fn with_egress(
    egress: &ExecutionEgress,
    env: &mut BTreeMap<String, String>,
    files: &mut Vec<JobFile<'static>>,
) -> JobProxy {
    let b64 = base64::engine::general_purpose::STANDARD;
    env.extend(egress::proxy_env().map(|(k, v)| (k.to_owned(), v)));
    env.extend(egress.sandbox.env.iter().cloned());
    files.extend(egress.sandbox.files.iter().map(|file| JobFile {
        path: file.path.clone(),
        content_b64: b64.encode(&file.contents).into(),
        mode: Some(file.mode),
    }));
    JobProxy {
        listen: egress::SANDBOX_PROXY_LISTEN.to_owned(),
        socket: egress::SANDBOX_SOCKET.to_owned(),
    }
}

/// The interpreter and where the program text goes: `/workspace/main.<ext>`.
pub fn command_for(language: &str) -> (Vec<String>, &'static str) {
    match language {
        "python" => (
            vec!["python3".into(), PYTHON_PROGRAM.into()],
            PYTHON_PROGRAM,
        ),
        "bash" => (vec!["bash".into(), BASH_PROGRAM.into()], BASH_PROGRAM),
        // Anything else the policy allowed and an image exists for: run the file as given.
        _ => (vec![OTHER_PROGRAM.into()], OTHER_PROGRAM),
    }
}

const PYTHON_PROGRAM: &str = "/workspace/main.py";
const BASH_PROGRAM: &str = "/workspace/main.sh";
const OTHER_PROGRAM: &str = "/workspace/main";

/// Upload names the program's own file takes.
pub fn program_names() -> [&'static str; 3] {
    ["main.py", "main.sh", "main"]
}

/// Where `pip install x` puts x (a user installation: the root file system is read-only and the
/// program is not root), in the execution's own `/workspace`: gone with the sandbox, kept across
/// a session's executions, counted in its disk limit. The image makes its `site-packages`
/// importable from the interpreter's start, before pip creates it
/// (images/python/sandgate_user_site.py).
pub const PYTHON_USER_BASE: &str = "/workspace/.local";

/// The whole environment of the sandboxed program. Nothing of the gateway's own leaks in.
/// Thread pools (OpenBLAS, OpenMP) are sized to the CPU quota, not to the host's cores that
/// gVisor reports: every thread costs one of the sandbox's pids. Commands pip installs
/// (`$PYTHONUSERBASE/bin`) come first on PATH.
pub fn sandbox_env(cpus: f64) -> BTreeMap<String, String> {
    let threads = format!("{}", cpus.ceil().max(1.0) as u32);
    let path = format!(
        "{PYTHON_USER_BASE}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
    let mut env: BTreeMap<String, String> = [
        ("PATH", path.as_str()),
        ("HOME", "/tmp"),
        ("PYTHONUSERBASE", PYTHON_USER_BASE),
        // pip's own version check would be one more (probably denied) connection per install.
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        ("LANG", "C.UTF-8"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MPLBACKEND", "Agg"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for pool in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"] {
        env.insert(pool.to_owned(), threads.clone());
    }
    env
}

fn failed(id: &str, err: &RuntimeError) -> Completion {
    completion(Err(RuntimeError::Unavailable(err.to_string())), id)
}

/// The record's ending, from the run's.
fn completion(ran: Result<Ran, RuntimeError>, id: &str) -> Completion {
    let ran = match ran {
        Ok(ran) => ran,
        Err(err) => {
            tracing::error!(execution_id = %id, error = %err, "sandbox failed");
            return Completion {
                status: ExecutionStatus::Error,
                exit_code: None,
                duration_ms: 0,
                stdout: Vec::new(),
                stderr: Vec::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                error: Some(err.to_string()),
                outputs: Collected::default(),
            };
        }
    };
    let (status, exit_code, error) = match ran.ending {
        Ending::Cancelled => (ExecutionStatus::Cancelled, None, None),
        Ending::TimedOut => (ExecutionStatus::Timeout, None, None),
        Ending::Oom { exit } => (ExecutionStatus::Oom, exit, None),
        Ending::Exited(0) => (ExecutionStatus::Succeeded, Some(0), None),
        Ending::Exited(code) => (ExecutionStatus::Failed, Some(i64::from(code)), None),
        Ending::Died { container_exit } => {
            tracing::warn!(execution_id = %id, exit = ?container_exit, "sandbox died under its program");
            let error = format!(
                "the sandbox stopped before its program ended (container exit {container_exit:?}); \
                 its kernel gave up (e.g. a fork bomb at the pids limit) or it was killed"
            );
            (ExecutionStatus::Killed, container_exit, Some(error))
        }
    };
    Completion {
        status,
        exit_code: exit_code.and_then(|code| i32::try_from(code).ok()),
        duration_ms: i64::try_from(ran.duration.as_millis()).unwrap_or(i64::MAX),
        stdout: ran.stdout.bytes,
        stderr: ran.stderr.bytes,
        stdout_truncated: ran.stdout.truncated,
        stderr_truncated: ran.stderr.truncated,
        error,
        outputs: Collected::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_live_in_the_workspace() {
        assert_eq!(command_for("python").0, ["python3", "/workspace/main.py"]);
        assert_eq!(command_for("bash").0, ["bash", "/workspace/main.sh"]);
        assert_eq!(command_for("ruby").0, ["/workspace/main"]);
    }
}
