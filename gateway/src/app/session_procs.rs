//! A session's processes (E2B's `process.Process`; `runtime::procs`): several at once beside
//! the session's runner, each one a session execution through the one pipeline (`request.kind:
//! "session_execution"`): decided and recorded under the session's lock (a moment, not the
//! process's life), started by the runtime as the program's user, its output kept under the
//! execution's `output_bytes` (past it: truncated, and the record says so) and streamed live,
//! its end recorded with its exit code, or `killed` / `cancelled` / `timeout` when the gateway
//! ended it. What a process leaves in `/output` is not collected per process (several may
//! write there at once; the session's cells collect it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::pipeline::{Ask, InSession, Outcome, Subject};
use super::reaper::LiveGuard;
use super::session_runs::{as_execution, closed_conflict};
use super::sessions::{OpenSession, SessionExecutionRequest};
use super::stream::Stream;
use super::subjects::ExecutionRecord;
use super::{App, AppError};
use crate::audit::{ApiKey, Completion, ExecutionRow};
use crate::outputs::Collected;
use crate::runtime::procs::{ProcessSignal, ProcessSpec, PtySize, StartedProcess};
use crate::runtime::{CappedOutput, Channel, OutputSink};
use crate::session_wire::TurnLimits;
use crate::status::ExecutionStatus;
use sandbox_protocol::PtyFrame;

/// Most input chunks queued for a process before `send_input` waits (bounded memory: at most
/// `INPUT_QUEUE * INPUT_CHUNK` bytes a process, whatever size the caller's messages are).
const INPUT_QUEUE: usize = 16;
/// Input is queued in pieces of at most this many bytes (one `PtyFrame` each for a PTY).
const INPUT_CHUNK: usize = sandbox_protocol::MAX_PTY_FRAME;
/// Longest wait for the session's lock (held for a moment by other starts, for a whole cell
/// by a running cell).
const HELD_WAIT: Duration = Duration::from_secs(5);
/// After the gateway ended a process: how long its output may still take to close.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// After its session closed: how long the process's output may still take to end.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long dockerd may take to report a finished process's exit code.
const EXIT_POLLS: u32 = 100;
const EXIT_POLL: Duration = Duration::from_millis(20);

/// A process to start in a session.
#[derive(Debug, Clone, Default)]
pub struct ProcessStart {
    /// What the record shows as the execution's code (what the caller asked to run).
    pub shown: String,
    pub argv: Vec<String>,
    /// Added to the session's environment.
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub stdin: bool,
    /// A terminal of this size (E2B's `pty.create`): input and resizes reach it, its output
    /// is what the terminal shows (kept as the record's stdout).
    pub pty: Option<PtySize>,
    pub timeout_ms: Option<u64>,
    pub e2b: Option<api_types::E2bInput>,
}

/// What became of a start.
#[derive(Debug)]
pub enum ProcessStarted {
    /// Denied (or sent to review, which a session execution never waits for): its record.
    Denied(ExecutionRow),
    /// Running: its record as it started, and how to reach it.
    Running(ExecutionRow, Arc<ProcessControl>),
}

/// Input for a process's stdin (or its terminal).
#[derive(Debug)]
pub enum ProcessInput {
    Data(Vec<u8>),
    Close,
    /// A new size for a PTY process's terminal.
    Resize(PtySize),
}

/// A running process, as its callers reach it.
#[derive(Debug)]
pub struct ProcessControl {
    container: String,
    tag: String,
    /// Why the gateway ended it, once it did.
    stopped: Mutex<Option<ExecutionStatus>>,
    input: Option<mpsc::Sender<ProcessInput>>,
    /// Runs on a terminal: its input travels as `PtyFrame`s.
    pty: bool,
}

impl ProcessControl {
    fn stop(&self, why: ExecutionStatus) -> bool {
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        if stopped.is_some() {
            return false;
        }
        *stopped = Some(why);
        true
    }

    fn stopped(&self) -> Option<ExecutionStatus> {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the process runs on a terminal.
    pub fn is_pty(&self) -> bool {
        self.pty
    }

    /// Queues input for the process's stdin (a PTY process's terminal).
    pub async fn send_input(&self, input: ProcessInput) -> Result<(), AppError> {
        match (&input, self.pty) {
            (ProcessInput::Close, true) => {
                return Err(AppError::Conflict(format!(
                    "process {} runs on a PTY: send Ctrl-D (0x04) to end its input",
                    self.tag
                )))
            }
            (ProcessInput::Resize(_), false) => {
                return Err(AppError::Conflict(format!(
                    "process {} has no PTY to resize",
                    self.tag
                )))
            }
            _ => {}
        }
        let Some(sender) = &self.input else {
            return Err(AppError::Conflict(format!(
                "process {} was started without stdin",
                self.tag
            )));
        };
        let closed = || AppError::Conflict(format!("the stdin of process {} is closed", self.tag));
        match input {
            ProcessInput::Data(bytes) => {
                for chunk in bytes.chunks(INPUT_CHUNK) {
                    sender
                        .send(ProcessInput::Data(chunk.to_vec()))
                        .await
                        .map_err(|_| closed())?;
                }
                Ok(())
            }
            ProcessInput::Close | ProcessInput::Resize(_) => {
                sender.send(input).await.map_err(|_| closed())
            }
        }
    }

    /// Takes back a `stop` that found nothing to stop (the process had ended by itself).
    fn unstop(&self, why: ExecutionStatus) {
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        if *stopped == Some(why) {
            *stopped = None;
        }
    }
}

/// An admitted start: its record, the session's container, the execution's limits, the
/// session's environment.
type Admitted = (
    ExecutionRow,
    String,
    policy_engine::Limits,
    BTreeMap<String, String>,
);

/// One of a session's running processes, counted while it lives (`OpenSession::processes`).
struct Running(Arc<OpenSession>);

impl Running {
    fn of(open: &Arc<OpenSession>) -> Self {
        open.processes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running(Arc::clone(open))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .processes
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the follower of one process needs.
struct Following {
    /// Counted among the session's running processes until the follower is done.
    _running: Running,
    row: ExecutionRow,
    started: StartedProcess,
    control: Arc<ProcessControl>,
    live: LiveGuard,
    stream: Arc<Stream>,
    limits: policy_engine::Limits,
    open: Arc<OpenSession>,
}

impl App {
    /// Starts a process in session `id` beside its runner (several may run at once).
    pub async fn start_session_process(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        start: ProcessStart,
    ) -> Result<ProcessStarted, AppError> {
        if let Some(session) = self.session_held_elsewhere(caller, id).await? {
            // Its sandbox is another replica's: its processes' streams are that replica's.
            return Err(AppError::ReplicaUnavailable(format!(
                "session {id} is served by replica {}: start its processes there",
                session.instance
            )));
        }
        let session_row = self.get_session(caller, id).await?;
        let open = self
            .sessions
            .get(id)
            .ok_or_else(|| closed_conflict(id, &session_row))?;
        self.resume_paused(&session_row).await?;
        checked_env(&start.env)?;
        let decided = self
            .decide_process(caller, &session_row, &open, &start)
            .await?;
        let (row, container, limits, mut env) = match decided {
            Ok(admitted) => admitted,
            Err(denied) => return Ok(ProcessStarted::Denied(denied)),
        };
        env.extend(start.env);
        let spec = ProcessSpec {
            tag: row.id.clone(),
            argv: start.argv,
            env: checked_env(&env)?,
            cwd: start.cwd,
            stdin: start.stdin,
            pty: start.pty,
        };
        self.launch_process((row, container, limits), spec, open)
            .await
    }

    /// Starts an admitted process and its follower; its record as it started.
    async fn launch_process(
        self: &Arc<Self>,
        (row, container, limits): (ExecutionRow, String, policy_engine::Limits),
        spec: ProcessSpec,
        open: Arc<OpenSession>,
    ) -> Result<ProcessStarted, AppError> {
        let live = self.live.track(&row.id);
        let stream = self.streams.open(&row.id);
        self.touch(&open);
        if let Err(err) = self
            .audit
            .mark_running(
                &row.id,
                crate::ids::now_micros(),
                super::launch::Start::Warm,
                &container,
            )
            .await
        {
            tracing::warn!(execution_id = %row.id, error = %err, "could not mark running");
        }
        let running = Running::of(&open);
        let spec_pty = spec.pty;
        let mut started = match self.runtime.start_process(&container, spec).await {
            Ok(started) => started,
            Err(err) => {
                let message = format!("the process could not be started: {err}");
                self.finish_process(row, failed(&message), &stream).await;
                return Err(AppError::ReplicaUnavailable(message));
            }
        };
        let pty = spec_pty.is_some();
        let control = Arc::new(ProcessControl {
            container,
            tag: row.id.clone(),
            stopped: Mutex::new(None),
            input: started.input.take().map(|stdin| feed_stdin(stdin, pty)),
            pty,
        });
        let mut shown = row.clone();
        shown.status = ExecutionStatus::Running;
        let following = Following {
            _running: running,
            row,
            started,
            control: Arc::clone(&control),
            live,
            stream,
            limits,
            open,
        };
        let app = Arc::clone(self);
        self.tasks
            .spawn(async move { app.follow_process(following).await });
        Ok(ProcessStarted::Running(shown, control))
    }

    /// The decision and its record, under the session's lock: the admitted record, the
    /// session's container and the execution's limits, or the denied record.
    async fn decide_process(
        self: &Arc<Self>,
        caller: &ApiKey,
        session_row: &crate::audit::sessions::SessionRow,
        open: &OpenSession,
        start: &ProcessStart,
    ) -> Result<Result<Admitted, ExecutionRow>, AppError> {
        let id = session_row.id.as_str();
        let mut guard = tokio::time::timeout(HELD_WAIT, open.held.lock())
            .await
            .map_err(|_| busy_with_a_cell(id))?;
        let held = guard
            .as_mut()
            .ok_or_else(|| closed_conflict(id, session_row))?;
        let request = SessionExecutionRequest {
            code: start.shown.clone(),
            limits: TurnLimits {
                timeout_ms: start.timeout_ms,
            },
            e2b: start.e2b.clone(),
            ..SessionExecutionRequest::default()
        };
        let as_execution = as_execution(&held.language, request)?;
        let ask = Ask {
            caller,
            subject: Subject::SessionExecution(InSession {
                row: session_row,
                executions: held.executions,
                owner: self.session_party(&session_row.key_id).await?,
                runnable: &held.runnable,
                e2b: start.e2b.clone(),
            }),
            request: &as_execution,
            files: &[],
            from_snapshot: None,
        };
        let (ExecutionRecord { row, event }, runnable) =
            match self.pipeline::<ExecutionRecord>(&ask).await? {
                Outcome::Denied(record) => return Ok(Err(record.row)),
                Outcome::Held((row, _)) => return Ok(Err(row)),
                Outcome::Admitted(record, runnable) => (record, runnable),
            };
        self.audit.record_execution_decision(&row, &event).await?;
        held.executions += 1;
        // Counted in the session's row as a cell is (no cell runs: this holds the lock).
        let _ = self
            .audit
            .set_session_status(id, crate::session_wire::SessionStatus::Ready, true)
            .await;
        let env = session_env(held, &runnable.limits);
        Ok(Ok((
            row,
            held.sandbox.name().to_owned(),
            runnable.limits,
            env,
        )))
    }

    /// Sends `signal` to a running process; whether it still ran. A `Kill` is recorded as
    /// the process's end (`killed`).
    pub async fn signal_session_process(
        &self,
        control: &ProcessControl,
        signal: ProcessSignal,
    ) -> Result<bool, AppError> {
        // Marked before the signal: the follower may see the end before this call returns.
        let kill = signal == ProcessSignal::Kill && control.stop(ExecutionStatus::Killed);
        let signalled = self
            .runtime
            .signal_process(&control.container, &control.tag, signal)
            .await
            .map_err(|err| {
                AppError::ReplicaUnavailable(format!("signalling the process failed: {err}"))
            });
        if kill && !matches!(signalled, Ok(true)) {
            control.unstop(ExecutionStatus::Killed);
        }
        signalled
    }

    /// Keeps the process's output until it ends (its deadline and a cancel end it), then
    /// completes its record.
    async fn follow_process(self: Arc<Self>, following: Following) {
        let Following {
            _running,
            row,
            started,
            control,
            live,
            stream,
            limits,
            open,
        } = following;
        let began = Instant::now();
        let cap = usize::try_from(limits.output_bytes).unwrap_or(usize::MAX);
        let timeout = Duration::from_millis(limits.timeout_ms);
        let StartedProcess { handle, output, .. } = started;
        let kept = self
            .pump_process(output, (&control, &live, &open), &stream, (cap, timeout))
            .await;
        let exit = self.process_exit(&handle).await;
        if open.closing.is_cancelled() {
            // Its sandbox went with its session before its output said so.
            control.stop(ExecutionStatus::Killed);
        }
        let done = process_completion(kept, control.stopped(), exit, began.elapsed());
        self.touch(&open);
        self.finish_process(row, done, &stream).await;
        drop(live);
    }

    /// The process's output under the cap, to its end (or a grace after the gateway ended it).
    async fn pump_process(
        &self,
        mut output: BoxStream<'static, Result<(Channel, Vec<u8>), String>>,
        (control, live, open): (&ProcessControl, &LiveGuard, &OpenSession),
        stream: &Arc<Stream>,
        (cap, timeout): (usize, Duration),
    ) -> Kept {
        let mut kept = Kept::default();
        let cancel = live.cancel_token();
        let closing = open.closing.clone();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut grace: Option<tokio::time::Instant> = None;
        loop {
            let stopping = grace.is_some();
            let grace_at = grace.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                frame = output.next() => match frame {
                    Some(Ok((channel, bytes))) => kept.push(channel, &bytes, cap, stream),
                    Some(Err(err)) => {
                        kept.error = Some(format!("reading the process's output failed: {err}"));
                        return kept;
                    }
                    None => return kept,
                },
                () = &mut deadline, if !stopping => {
                    self.end_process(control, ExecutionStatus::Timeout).await;
                    grace = Some(tokio::time::Instant::now() + STOP_GRACE);
                }
                () = cancel.cancelled(), if !stopping => {
                    self.end_process(control, ExecutionStatus::Cancelled).await;
                    grace = Some(tokio::time::Instant::now() + STOP_GRACE);
                }
                () = closing.cancelled(), if !stopping => {
                    // Its sandbox goes with its session (closed, killed, timed out).
                    control.stop(ExecutionStatus::Killed);
                    grace = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
                () = tokio::time::sleep_until(grace_at), if stopping => {
                    kept.error = Some("the process's output did not end after it was killed".to_owned());
                    return kept;
                }
            }
        }
    }

    async fn end_process(&self, control: &ProcessControl, why: ExecutionStatus) {
        control.stop(why);
        if let Err(err) = self
            .runtime
            .signal_process(&control.container, &control.tag, ProcessSignal::Kill)
            .await
        {
            tracing::warn!(process = %control.tag, error = %err, "killing a process failed");
        }
    }

    /// The exit code dockerd recorded for the process's supervisor.
    async fn process_exit(&self, handle: &str) -> Option<i64> {
        for _ in 0..EXIT_POLLS {
            match self.runtime.process_exit(handle).await {
                Ok(Some(code)) => return Some(code),
                Ok(None) => tokio::time::sleep(EXIT_POLL).await,
                Err(err) => {
                    tracing::warn!(error = %err, "reading a process's exit failed");
                    return None;
                }
            }
        }
        None
    }

    async fn finish_process(&self, row: ExecutionRow, done: Completion, stream: &Stream) {
        let stored = self.complete_durably(row, done).await;
        stream.close(super::executions::exit_summary(&stored));
        self.streams.remove(&stored.id);
    }

    fn touch(&self, open: &OpenSession) {
        *open
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// What a process printed, kept under the cap.
#[derive(Debug, Default)]
struct Kept {
    stdout: CappedOutput,
    stderr: CappedOutput,
    error: Option<String>,
}

impl Kept {
    fn push(&mut self, channel: Channel, bytes: &[u8], cap: usize, stream: &Stream) {
        let out = match channel {
            Channel::Stdout => &mut self.stdout,
            Channel::Stderr => &mut self.stderr,
        };
        let kept = out.push(bytes, cap);
        stream.push(channel, kept);
    }
}

fn busy_with_a_cell(id: &str) -> AppError {
    AppError::Conflict(format!(
        "session {id} is busy with a cell; start the process once it ended"
    ))
}

/// The session's environment, as its runner got it (its egress bridge's included), with E2B's
/// `HOME`: processes are started only by the E2B layer, whose SDKs assume `/home/user`.
fn session_env(
    held: &super::sessions::Held,
    limits: &policy_engine::Limits,
) -> BTreeMap<String, String> {
    let mut env = super::launch::sandbox_env(limits.cpus);
    env.insert("HOME".to_owned(), crate::runtime::USER_HOME.to_owned());
    if let Some(egress) = &held.egress {
        super::launch::with_egress(egress, &mut env, &mut Vec::new());
    }
    env
}

/// Writes queued input to the process's stdin until it is closed or the process is gone. A
/// PTY process's stdin is its supervisor's control channel: input and sizes as `PtyFrame`s.
fn feed_stdin(
    mut stdin: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    pty: bool,
) -> mpsc::Sender<ProcessInput> {
    let (sender, mut receiver) = mpsc::channel::<ProcessInput>(INPUT_QUEUE);
    tokio::spawn(async move {
        while let Some(input) = receiver.recv().await {
            let bytes = match input {
                ProcessInput::Data(bytes) if pty => PtyFrame::Input(bytes).encode(),
                ProcessInput::Data(bytes) => bytes,
                ProcessInput::Resize(size) => PtyFrame::Resize(size).encode(),
                ProcessInput::Close => {
                    let _ = stdin.shutdown().await;
                    return;
                }
            };
            if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                return;
            }
        }
    });
    sender
}

/// The session's environment names and values, as `NAME=value`.
fn checked_env(env: &BTreeMap<String, String>) -> Result<Vec<String>, AppError> {
    env.iter()
        .map(|(name, value)| {
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
                && !value.contains('\0');
            if valid {
                Ok(format!("{name}={value}"))
            } else {
                Err(AppError::Invalid(format!(
                    "{name:?} is not a valid environment variable name (or its value holds NUL)"
                )))
            }
        })
        .collect()
}

fn failed(message: &str) -> Completion {
    Completion {
        status: ExecutionStatus::Error,
        exit_code: None,
        duration_ms: 0,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        error: Some(message.to_owned()),
        outputs: Collected::default(),
    }
}

/// The record's ending: the gateway's reason when it ended the process, else the exit code.
fn process_completion(
    kept: Kept,
    stopped: Option<ExecutionStatus>,
    exit: Option<i64>,
    took: Duration,
) -> Completion {
    let (status, exit_code, error) = match (stopped, exit) {
        (Some(why), _) => (why, None, None),
        (None, Some(0)) => (ExecutionStatus::Succeeded, Some(0), None),
        (None, Some(code)) => (
            ExecutionStatus::Failed,
            Some(i32::try_from(code).unwrap_or(i32::MAX)),
            None,
        ),
        (None, None) => (
            ExecutionStatus::Error,
            None,
            Some("the process's exit was not reported".to_owned()),
        ),
    };
    Completion {
        status,
        exit_code,
        duration_ms: i64::try_from(took.as_millis()).unwrap_or(i64::MAX),
        stdout_truncated: kept.stdout.truncated,
        stderr_truncated: kept.stderr.truncated,
        stdout: kept.stdout.bytes,
        stderr: kept.stderr.bytes,
        error: error.or(kept.error),
        outputs: Collected::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_s_reason_wins_over_the_exit_code() {
        let done = process_completion(
            Kept::default(),
            Some(ExecutionStatus::Killed),
            Some(137),
            Duration::ZERO,
        );
        assert_eq!(
            (done.status, done.exit_code),
            (ExecutionStatus::Killed, None)
        );
        let done = process_completion(Kept::default(), None, Some(7), Duration::ZERO);
        assert_eq!(
            (done.status, done.exit_code),
            (ExecutionStatus::Failed, Some(7))
        );
        let done = process_completion(Kept::default(), None, None, Duration::ZERO);
        assert_eq!(done.status, ExecutionStatus::Error);
    }

    #[test]
    fn env_names_are_names() {
        let ok = BTreeMap::from([("A_1".to_owned(), "x y".to_owned())]);
        assert_eq!(checked_env(&ok).unwrap(), ["A_1=x y"]);
        for bad in ["1A", "A;B", "", "A=B"] {
            let env = BTreeMap::from([(bad.to_owned(), "x".to_owned())]);
            assert!(checked_env(&env).is_err(), "{bad}");
        }
    }
}
