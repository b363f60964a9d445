//! The container runtime seam: what the gateway needs from a sandbox, and nothing about Docker.
//! Only `docker/` imports bollard.
//!
//! A sandbox is described by a [`SandboxPlan`] (what it is, fixed at creation) and started
//! with [`SandboxRuntime::start`]; it then waits for its job. [`Sandbox::run`] hands the job
//! over and runs it under a [`RunControl`] (deadline, output cap, live sink, cancel) to an
//! [`Ending`]. A cold execution starts its sandbox and runs it at once; a warm one claims a
//! sandbox the pool started earlier. Both run through the same [`Sandbox::run`].

pub mod docker;
pub mod procs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use policy_engine::Limits;
pub use sandbox_protocol::{
    ExitTrailer, FileAnswer, FileRequest, Job, JobFile, JobProxy, RichResults,
};

/// Label carried by a sandbox started for one execution; its value is the execution id.
pub const EXECUTION_LABEL: &str = "sandgate.execution";
/// Label carried by a sandbox the warm pool started; its value is the language.
pub const POOL_LABEL: &str = "sandgate.pool";
/// Label naming the gateway instance that created the container (every sandbox has it).
pub const INSTANCE_LABEL: &str = "sandgate.instance";
/// Where the `sandbox-init` binary is mounted, read-only, inside every sandbox.
pub const INIT_PATH: &str = "/sandgate/init";
/// Inside the sandbox: the directory holding the egress socket, the socket, and the bridge.
pub const SANDBOX_SOCKET_DIR: &str = "/run/sandgate";
pub const SANDBOX_SOCKET: &str = "/run/sandgate/egress.sock";
pub const SANDBOX_PROXY_LISTEN: &str = "127.0.0.1:3128";
/// Where the output area is mounted inside the sandbox.
pub const OUTPUT_PATH: &str = "/output";
/// The working directory, where uploaded files and the program land.
pub const WORKSPACE: &str = "/workspace";
/// The program's home, E2B's `/home/user` (images/build.sh names the program's uid `user` with
/// this home): a size-capped tmpfs in every sandbox, as `/workspace` and `/tmp` are. E2B
/// sandboxes start their runner and commands there; other sessions and executions keep
/// [`WORKSPACE`].
pub const USER_HOME: &str = "/home/user";

/// A host directory mounted read-only into the sandbox (a dataset).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadOnlyMount {
    pub source: PathBuf,
    pub target: String,
}

/// Whose a sandbox is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Started for this execution (cold).
    Execution(String),
    /// Started ahead by the warm pool for this language; no execution yet.
    Pool { language: String },
}

/// What waits in a sandbox for its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waits {
    /// Only the init: the job follows the start at once (cold).
    Init,
    /// A pooled init, waiting as a resident runner (`sandbox-init pool ...`).
    Pool(PoolRunner),
    /// A session's init (`sandbox-init session python|bash`): it waits for the opening line
    /// ([`Sandbox::open_session`]), then serves turns ([`Sandbox::turn`]).
    Session(SessionRunner),
}

/// What runs a session's cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRunner {
    Python,
    Bash,
}

impl SessionRunner {
    /// The runner for a language, if it has one.
    pub fn for_language(language: &str) -> Option<SessionRunner> {
        match language {
            "python" => Some(SessionRunner::Python),
            "bash" => Some(SessionRunner::Bash),
            _ => None,
        }
    }

    /// The init's arguments (see `sandbox_protocol::SESSION_MODE`).
    pub fn init_args(self) -> Vec<String> {
        let name = match self {
            SessionRunner::Python => sandbox_protocol::SESSION_PYTHON,
            SessionRunner::Bash => sandbox_protocol::SESSION_BASH,
        };
        vec![sandbox_protocol::SESSION_MODE.to_owned(), name.to_owned()]
    }

    /// The arguments of an extra code context's init (`sandbox_protocol::SESSION_CONTEXT`).
    pub fn context_args(self) -> Vec<String> {
        let mut args = self.init_args();
        args.push(sandbox_protocol::SESSION_CONTEXT.to_owned());
        args
    }
}

/// The resident runner of a pooled sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolRunner {
    /// The init alone waits; it spawns the program when the job arrives.
    Plain,
    /// A Python interpreter with these modules imported runs the program itself.
    Python { preload: Vec<String> },
}

impl PoolRunner {
    /// The init's arguments (see `sandbox_protocol::POOL_MODE`).
    pub fn init_args(&self) -> Vec<String> {
        let mut args = vec![sandbox_protocol::POOL_MODE.to_owned()];
        if let PoolRunner::Python { preload } = self {
            args.push(sandbox_protocol::PYTHON_RUNNER_NAME.to_owned());
            args.extend(preload.iter().cloned());
        }
        args
    }
}

/// What a sandbox is, fixed when it is created: image, runtime, the container limits (memory,
/// CPU, pids, disk), mounts, its egress socket directory and output area, its environment.
#[derive(Debug, Clone)]
pub struct SandboxPlan {
    /// Names the sandbox (`sandgate-<id>` is the container) and its host directories.
    pub id: String,
    pub owner: Owner,
    pub instance: String,
    pub image: String,
    /// Docker runtime name (`runsc`).
    pub runtime: String,
    pub init_binary: PathBuf,
    /// Container limits; `timeout_ms` and `output_bytes` are the run's ([`RunControl`]).
    pub limits: Limits,
    pub mounts: Vec<ReadOnlyMount>,
    /// The sandbox's egress socket directory, mounted at `/run/sandgate`: the one host path a
    /// sandbox may reach that is not read-only data. Empty until a grant is served in it.
    pub egress_dir: PathBuf,
    /// The sandbox's output area on the host (a tmpfs of its own), mounted at `/output`.
    pub output_dir: PathBuf,
    /// The container's environment (the init's; a job may replace the program's).
    pub env: BTreeMap<String, String>,
    pub waits: Waits,
}

impl SandboxPlan {
    /// The container's name.
    pub fn container_name(&self) -> String {
        container_name(&self.id)
    }
}

/// The container name of sandbox `id`.
pub fn container_name(id: &str) -> String {
    format!("sandgate-{id}")
}

/// The control handles of one run: none of it is known before the execution claims a sandbox.
#[derive(Debug, Clone)]
pub struct RunControl {
    pub timeout: Duration,
    /// Bytes of stdout, and of stderr, kept.
    pub output_cap: usize,
    /// Receives every byte of output that is kept, as it arrives (for streaming).
    pub sink: Option<Arc<dyn OutputSink>>,
    /// Fires when the execution is cancelled: the sandbox is killed at once.
    pub cancel: CancellationToken,
}

/// Which stream output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Stdout,
    Stderr,
}

/// Where kept output goes while the program runs.
pub trait OutputSink: Send + Sync + std::fmt::Debug {
    fn push(&self, channel: Channel, bytes: &[u8]);
}

/// Output captured up to a byte cap; the rest is read and dropped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CappedOutput {
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

impl CappedOutput {
    /// Keeps what fits under `cap` and returns it.
    pub fn push<'a>(&mut self, chunk: &'a [u8], cap: usize) -> &'a [u8] {
        let room = cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        let kept = &chunk[..chunk.len().min(room)];
        self.bytes.extend_from_slice(kept);
        kept
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// How a run ended: exactly one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// sandbox-init reported the program's end with this code (the exit trailer).
    Exited(u8),
    /// The deadline passed: the sandbox was killed.
    TimedOut,
    /// Stopped on request (`POST /v1/executions/{id}/cancel`).
    Cancelled,
    /// The memory limit was hit: dockerd's OOM flag, or the sandbox's memory cgroup's own
    /// notification (`docker/oom.rs`).
    Oom { exit: Option<i64> },
    /// sandbox-init never reported an end: the sandbox died under the program (gVisor's kernel
    /// gave up, or the container was killed).
    Died { container_exit: Option<i64> },
}

/// How one turn of a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnding {
    /// The runner answered: the cell's code and, for python, its final expression's `repr`
    /// and what the cell displayed.
    Exited {
        code: u8,
        result: Option<String>,
        results: Option<RichResults>,
    },
    /// The deadline passed and the cell was interrupted (SIGINT); `recovered`: the runner
    /// answered within the grace and the session goes on, else the sandbox was killed.
    TimedOut { recovered: bool },
    /// Cancelled, as for [`TurnEnding::TimedOut`].
    Cancelled { recovered: bool },
    /// The sandbox ended under the turn (its memory limit, a crash of the runner).
    Ended(Ending),
}

impl TurnEnding {
    /// Whether the session can take another turn.
    pub fn session_lives(&self) -> bool {
        match self {
            TurnEnding::Exited { .. } => true,
            TurnEnding::TimedOut { recovered } | TurnEnding::Cancelled { recovered } => *recovered,
            TurnEnding::Ended(_) => false,
        }
    }
}

/// A finished turn.
#[derive(Debug, Clone)]
pub struct TurnRan {
    pub ending: TurnEnding,
    pub stdout: CappedOutput,
    pub stderr: CappedOutput,
    /// What the init found in `/output` after the turn that the host cannot see (FIFOs,
    /// sockets: see sandbox-init's `leftovers`); paths relative to `/output`.
    pub special_files: Vec<String>,
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct Ran {
    pub ending: Ending,
    /// Nothing of the program runs any more, so what it left (the output area) can no longer
    /// change under the gateway: dockerd confirmed the container stopped (a gVisor sandbox
    /// ends with its PID 1, every process and its kernel with it), or the init's authenticated
    /// end said it killed and reaped every other process (sandbox-init's `quiesce`; the
    /// container may still be ending). Removal may follow later.
    pub settled: bool,
    pub stdout: CappedOutput,
    pub stderr: CappedOutput,
    /// What the init found in `/output` once the program ended that the host cannot see
    /// (FIFOs, sockets: see sandbox-init's `leftovers`), from its exit trailer.
    pub special_files: Vec<String>,
    /// When the job was handed over, and how long the run took from there.
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
}

/// A started sandbox, waiting for its job.
pub trait Sandbox: Send + std::fmt::Debug {
    /// The container's name.
    fn name(&self) -> &str;
    /// Resolves if the sandbox ends before it got a job (a pooled one that died waiting);
    /// drops whatever it prints meanwhile. Cancel-safe: nothing is lost by dropping it.
    fn closed(&mut self) -> BoxFuture<'_, ()>;
    /// Hands the job over, keeps output under the control's cap until the program ends, the
    /// deadline passes or the run is cancelled (both kill it). The sandbox is left stopped, not
    /// removed: the caller collects its output area, then [`Sandbox::discard`]s it, off the
    /// response's path.
    fn run(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<Ran, RuntimeError>>;
    /// Removes the sandbox without running anything.
    fn discard(self: Box<Self>) -> BoxFuture<'static, ()>;
    /// A session sandbox ([`Waits::Session`]): hands over the opening line (its environment,
    /// files and proxy bridge are the session's; its `argv` is ignored). stdin stays open.
    fn open_session(&mut self, job: Job<'static>) -> BoxFuture<'_, Result<(), RuntimeError>> {
        let _ = job;
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no sessions".into(),
            ))
        }
        .boxed()
    }
    /// Hands one turn over (its `argv` is the cell file, which its `files` write) and pumps
    /// its output until the runner's end markers, the deadline or a cancel (both interrupt the
    /// cell with SIGINT and wait a moment for the runner to recover, else kill the sandbox).
    fn turn(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<TurnRan, RuntimeError>> {
        let _ = (job, control);
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no sessions".into(),
            ))
        }
        .boxed()
    }
    /// A session sandbox between turns: one file operation, performed by its init (never by
    /// anything the program could have changed) and answered (`sandbox_protocol`'s `files`).
    fn file_op(&mut self, request: FileRequest) -> BoxFuture<'_, Result<FileAnswer, RuntimeError>> {
        let _ = request;
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no sessions".into(),
            ))
        }
        .boxed()
    }

    /// A session sandbox: starts an extra code context beside its runner, its init given the
    /// opening line `job` (environment, cwd; no proxy bridge: the session's serves it), and
    /// waits until it answers.
    fn open_context(
        &mut self,
        runner: SessionRunner,
        job: Job<'static>,
    ) -> BoxFuture<'_, Result<Box<dyn CodeContext>, RuntimeError>> {
        let _ = (runner, job);
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no code contexts".into(),
            ))
        }
        .boxed()
    }

    /// Checkpoints a session sandbox that runs nothing into the directory `image` (which must
    /// not exist yet; its parent must): its memory, kernel state and tmpfs mounts. The sandbox
    /// is stopped after it (also when it fails: runsc loses it); [`Sandbox::discard`] it.
    fn checkpoint<'a>(&'a mut self, image: &'a Path) -> BoxFuture<'a, Result<(), RuntimeError>> {
        let _ = image;
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no checkpoints".into(),
            ))
        }
        .boxed()
    }
}

/// An extra code context of a session sandbox (E2B's `/contexts`): its own init and runner
/// beside the session's, with its own state, serving turns as [`Sandbox::turn`] does. An
/// interrupt (deadline, cancel) ends it (the turn ends unrecovered); the sandbox goes on.
pub trait CodeContext: Send + std::fmt::Debug {
    fn turn(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<TurnRan, RuntimeError>>;
    /// Ends it: its runner is killed, its init exits.
    fn close(self: Box<Self>) -> BoxFuture<'static, ()>;
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("container runtime unavailable: {0}")]
    Unavailable(String),
    #[error("{operation} timed out after {seconds} s")]
    Timeout {
        operation: &'static str,
        seconds: u64,
    },
    #[error("{operation} failed: {message}")]
    Docker {
        operation: &'static str,
        message: String,
    },
    #[error("sandbox-init binary {path} is missing; build it with `make build`")]
    MissingInit { path: PathBuf },
    /// A checkpoint refused before anything was written: the sandbox runs on.
    #[error(
        "no space left for the checkpoint in {}: {free} bytes free, and the sandbox holds \
         {needed} bytes of memory (what its image may take); nothing was written",
        dir.display()
    )]
    NoRoom {
        dir: PathBuf,
        free: u64,
        needed: u64,
    },
}

/// Readiness of the runtime, for `/readyz`.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeHealth {
    pub docker: Result<String, String>,
    pub runtimes: BTreeMap<String, bool>,
}

/// A sandbox container as listed by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    pub container_id: String,
    /// The container's name, without Docker's leading `/`.
    pub name: String,
    pub owner: Owner,
    pub instance: Option<String>,
}

/// The one seam where a fake is allowed (fast tests of orchestration); security properties are
/// only ever shown through the Docker implementation.
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Creates and starts a sandbox that waits for its job. With [`Waits::Pool`] it returns
    /// once the resident runner said it is ready; a sandbox that fails on the way is removed.
    fn start(&self, plan: SandboxPlan) -> BoxFuture<'_, Result<Box<dyn Sandbox>, RuntimeError>>;
    /// Checks the daemon and which of `runtimes` it has registered.
    fn health<'a>(&'a self, runtimes: &'a [String]) -> BoxFuture<'a, RuntimeHealth>;
    /// Every sandbox container, whoever created it.
    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, RuntimeError>>;
    /// Kills and removes one container, however wedged.
    fn destroy<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// Starts a process beside a session sandbox's runner (`procs`), as the program's user.
    fn start_process<'a>(
        &'a self,
        container: &'a str,
        spec: procs::ProcessSpec,
    ) -> BoxFuture<'a, Result<procs::StartedProcess, RuntimeError>> {
        let _ = (container, spec);
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no processes".into(),
            ))
        }
        .boxed()
    }
    /// Starts a directory watcher in a session sandbox (`procs::WatchSpec`), as the program's
    /// user: its stdout carries its lines, its stdin its requests.
    fn start_watcher<'a>(
        &'a self,
        container: &'a str,
        spec: procs::WatchSpec,
    ) -> BoxFuture<'a, Result<procs::StartedProcess, RuntimeError>> {
        let _ = (container, spec);
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no watchers".into(),
            ))
        }
        .boxed()
    }
    /// The exit code of a started process whose output ended (`None`: it still runs, or
    /// the runtime does not know).
    fn process_exit<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, RuntimeError>> {
        let _ = handle;
        async { Ok(None) }.boxed()
    }
    /// Signals the started process of `tag`; whether one ran.
    fn signal_process<'a>(
        &'a self,
        container: &'a str,
        tag: &'a str,
        signal: procs::ProcessSignal,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        let _ = (container, tag, signal);
        async { Ok(false) }.boxed()
    }
    /// Starts a sandbox for `plan` restored from a checkpoint image ([`Sandbox::checkpoint`]):
    /// it goes on where the checkpointed one stopped, in a new container with the plan's own
    /// egress socket directory and output area. A session sandbox needs no opening line.
    fn restore<'a>(
        &'a self,
        plan: SandboxPlan,
        image: &'a Path,
    ) -> BoxFuture<'a, Result<Box<dyn Sandbox>, RuntimeError>> {
        let _ = (plan, image);
        async {
            Err(RuntimeError::Unavailable(
                "this runtime has no checkpoints".into(),
            ))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_output_keeps_prefix_and_flags_truncation() {
        let mut out = CappedOutput::default();
        out.push(b"hello ", 8);
        assert!(!out.truncated);
        out.push(b"world", 8);
        assert_eq!(out.bytes, b"hello wo");
        assert!(out.truncated);
        out.push(b"more", 8);
        assert_eq!(out.bytes, b"hello wo");
    }

    #[test]
    fn pool_runners_name_their_init_arguments() {
        assert_eq!(PoolRunner::Plain.init_args(), ["pool"]);
        let python = PoolRunner::Python {
            preload: vec!["pandas".into()],
        };
        assert_eq!(python.init_args(), ["pool", "python", "pandas"]);
    }
}
