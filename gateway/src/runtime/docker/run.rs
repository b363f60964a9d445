//! One sandbox's life, phase by phase: create and attach, start, (pooled) wait until ready;
//! then, with its job: hand over, pump output, the deadline, inspect, remove.

use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, KillContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::body::container_body;
use super::call::{bounded, docker_error};
use super::cleanup;
use super::oom::OomWatch;
use crate::runtime::{
    CappedOutput, Channel, Ending, ExitTrailer, Job, Ran, RunControl, RuntimeError, Sandbox,
    SandboxPlan,
};
use sandbox_protocol::EndMarker;

/// After the program's deadline: how long to wait for the killed container to report its end.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// How long (steps of [`OOM_EVENT_POLL`]) to wait for dockerd's OOM flag after a SIGKILL end.
const OOM_EVENT_POLLS: u32 = 20;
const OOM_EVENT_POLL: Duration = Duration::from_millis(100);
/// The status of a program killed by SIGKILL (128 + 9).
const SIGKILLED: u8 = 137;
/// Most stdout a pooled sandbox may print before its ready line.
const MAX_BEFORE_READY: usize = 64 * 1024;

pub(super) type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, BollardError>> + Send>>;
pub(super) type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// A created, attached container.
pub struct DockerSandbox {
    pub(super) docker: Docker,
    pub(super) name: String,
    pub(super) input: Input,
    pub(super) output: Output,
    /// The cgroup's OOM notifications, registered once the container runs (`None` where it
    /// cannot be: dockerd's flag is then the only source).
    pub(super) oom: Option<OomWatch>,
}

impl std::fmt::Debug for DockerSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandbox")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How the wait for the program stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The container exited (with this code, if dockerd said).
    Exited(Option<i64>),
    /// The init's authenticated end (its end marker on stdout and its trailer on stderr):
    /// everything the program printed has arrived and nothing of it runs any more; the
    /// container is still ending.
    Ended,
    TimedOut,
    Cancelled,
}

impl DockerSandbox {
    /// Creates the container and attaches to it (before the start, so no output is lost).
    pub async fn create(docker: Docker, plan: &SandboxPlan) -> Result<DockerSandbox, RuntimeError> {
        let name = plan.container_name();
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        bounded(
            "create container",
            docker.create_container(Some(options), container_body(plan)),
        )
        .await?;
        let attach = AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .build();
        match bounded(
            "attach container",
            docker.attach_container(&name, Some(attach)),
        )
        .await
        {
            Ok(attached) => Ok(DockerSandbox {
                docker,
                name,
                input: attached.input,
                output: attached.output,
                oom: None,
            }),
            Err(err) => {
                remove(&docker, &name).await;
                Err(err)
            }
        }
    }

    pub async fn start(&mut self) -> Result<(), RuntimeError> {
        bounded(
            "start container",
            self.docker.start_container(&self.name, None),
        )
        .await
    }

    /// Registers for the container's cgroup OOM notifications (see `oom.rs`); must run while
    /// the container runs and before its job is handed over. Failing is logged, not fatal.
    pub async fn watch_oom(&mut self) {
        let pid = match bounded(
            "inspect container",
            self.docker.inspect_container(&self.name, None),
        )
        .await
        {
            Ok(info) => info.state.and_then(|state| state.pid).unwrap_or(0),
            Err(err) => {
                tracing::warn!(container = %self.name, error = %err, "no OOM watch: inspect failed");
                return;
            }
        };
        match OomWatch::register(pid) {
            Ok(watch) => self.oom = Some(watch),
            Err(err) => {
                tracing::warn!(container = %self.name, pid, error = %err, "no OOM watch on the sandbox's cgroup: dockerd's flag only");
            }
        }
    }

    /// Reads stdout until the pooled init's ready line; drops what comes before it.
    pub async fn ready(&mut self, timeout: Duration) -> Result<(), RuntimeError> {
        let wanted = format!("{}\n", sandbox_protocol::READY_LINE).into_bytes();
        let mut seen = Vec::new();
        let wait = async {
            while let Some(frame) = self.output.next().await {
                match frame {
                    Ok(LogOutput::StdOut { message }) => {
                        seen.extend_from_slice(&message);
                        if seen.windows(wanted.len()).any(|window| window == wanted) {
                            return Ok(());
                        }
                        if seen.len() > MAX_BEFORE_READY {
                            return Err("printed too much before its ready line".to_owned());
                        }
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        tracing::debug!(container = %self.name, stderr = %String::from_utf8_lossy(&message), "pooled sandbox");
                    }
                    Ok(_) => {}
                    Err(err) => return Err(err.to_string()),
                }
            }
            Err("ended before it was ready".to_owned())
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(RuntimeError::Docker {
                operation: "wait for the pooled sandbox",
                message,
            }),
            Err(_) => Err(RuntimeError::Timeout {
                operation: "wait for the pooled sandbox",
                seconds: timeout.as_secs(),
            }),
        }
    }

    /// Hand-over, pump and deadline, then inspect; the caller removes the container.
    async fn run_job(
        &mut self,
        mut job: Job<'static>,
        control: RunControl,
    ) -> Result<Ran, RuntimeError> {
        // A fresh secret per run authenticates sandbox-init's exit trailer.
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        job.exit_nonce = Some(nonce.clone());
        let mut line = serde_json::to_vec(&job).map_err(|err| RuntimeError::Docker {
            operation: "encode job",
            message: err.to_string(),
        })?;
        line.push(b'\n');
        drop(job);
        let started_at = crate::ids::now_micros();
        let started = Instant::now();
        let mut pump = Pump::new(&control, &nonce);
        let (stop, settled) = self.until_stop(&line, &mut pump, &control).await?;
        let duration = started.elapsed();
        let ending = match (stop, pump.init_exit) {
            // Under runsc an OOM takes the init with it: an end the init reported is not one.
            (Stop::Ended, Some(code)) => Ending::Exited(code),
            // dockerd only adds whether it was an OOM: without its answer the run's output and
            // the init's word still stand.
            _ => match self.inspect(stop, pump.init_exit).await {
                Ok(ending) => ending,
                Err(err) => {
                    tracing::warn!(container = %self.name, error = %err, "inspecting the ended sandbox failed; its ending is the init's word");
                    ending(stop, pump.init_exit, false, None)
                }
            },
        };
        Ok(Ran {
            ending,
            settled,
            special_files: pump.trailer.report().special_files.clone(),
            stdout: pump.stdout,
            stderr: pump.stderr,
            started_at,
            duration,
        })
    }

    /// Hands the job over and pumps output until the init's authenticated end, the container's
    /// exit, the deadline or a cancel (the last two kill it); and whether nothing of the program
    /// runs any more (the init said so, or dockerd confirmed the stop).
    async fn until_stop(
        &mut self,
        line: &[u8],
        pump: &mut Pump,
        control: &RunControl,
    ) -> Result<(Stop, bool), RuntimeError> {
        let DockerSandbox {
            docker,
            name,
            input,
            output,
            oom: _,
        } = self;
        let run = async {
            hand_over(input, line).await;
            if pump.drain(output).await {
                return Ok(Stop::Ended);
            }
            wait_exit(docker, name).await.map(Stop::Exited)
        };
        tokio::select! {
            finished = tokio::time::timeout(control.timeout, run) => match finished {
                Ok(stop) => {
                    let stop = stop?;
                    Ok((stop, stop != Stop::Exited(None)))
                }
                Err(_) => Ok((Stop::TimedOut, kill(docker, name).await)),
            },
            () = control.cancel.cancelled() => Ok((Stop::Cancelled, kill(docker, name).await)),
        }
    }

    /// Asks dockerd and the cgroup how the container ended. Under runsc an OOM kills gVisor's
    /// kernel, not just the program: the init reports nothing and the container ends with
    /// SIGKILL. An OOM is what either says: dockerd's flag (from a separate event that can
    /// trail the exit) or the cgroup's own notification (`oom.rs`, which may need the
    /// cgroup's removal to be sure), so a SIGKILL end without a word from the init is looked
    /// at again for a moment before it is called anything else.
    pub(super) async fn inspect(
        &mut self,
        stop: Stop,
        init_exit: Option<u8>,
    ) -> Result<Ending, RuntimeError> {
        let died = matches!(stop, Stop::Exited(_)) && init_exit.is_none();
        let mut polls = 0;
        loop {
            let state = bounded(
                "inspect container",
                self.docker.inspect_container(&self.name, None),
            )
            .await?
            .state
            .unwrap_or_default();
            let cgroup_oom = self.oom.as_mut().is_some_and(OomWatch::saw_oom);
            // The cgroup's word counts only when the init said nothing: a notification can
            // also come from an OOM elsewhere in its hierarchy, and a program that ended with
            // an authenticated trailer was not killed.
            let oom = state.oom_killed == Some(true) || (cgroup_oom && init_exit.is_none());
            let settled = !died || oom || state.exit_code != Some(137);
            if settled || polls >= OOM_EVENT_POLLS {
                return Ok(ending(stop, init_exit, oom, state.exit_code));
            }
            polls += 1;
            tokio::time::sleep(OOM_EVENT_POLL).await;
        }
    }
}

/// The ending, from how the wait stopped, the init's report and dockerd's view.
fn ending(stop: Stop, init_exit: Option<u8>, oom: bool, container_exit: Option<i64>) -> Ending {
    let exit = match stop {
        Stop::Cancelled => return Ending::Cancelled,
        Stop::TimedOut => return Ending::TimedOut,
        Stop::Exited(exit) => exit,
        Stop::Ended => None,
    };
    if oom {
        return Ending::Oom {
            exit: init_exit.map(i64::from).or(exit).or(container_exit),
        };
    }
    match init_exit {
        Some(code) => Ending::Exited(code),
        None => Ending::Died {
            container_exit: exit.or(container_exit),
        },
    }
}

impl Sandbox for DockerSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn closed(&mut self) -> BoxFuture<'_, ()> {
        async move { while let Some(Ok(_)) = self.output.next().await {} }.boxed()
    }

    fn run(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<Ran, RuntimeError>> {
        self.run_job(job, control).boxed()
    }

    fn discard(self: Box<Self>) -> BoxFuture<'static, ()> {
        async move {
            remove(&self.docker, &self.name).await;
        }
        .boxed()
    }

    fn open_session(&mut self, job: Job<'static>) -> BoxFuture<'_, Result<(), RuntimeError>> {
        super::turn::open(self, job).boxed()
    }

    fn open_context(
        &mut self,
        runner: crate::runtime::SessionRunner,
        job: Job<'static>,
    ) -> BoxFuture<'_, Result<Box<dyn crate::runtime::CodeContext>, RuntimeError>> {
        async move {
            let context = super::context::open(&self.docker, &self.name, runner, job).await?;
            Ok(Box::new(context) as Box<dyn crate::runtime::CodeContext>)
        }
        .boxed()
    }

    fn turn(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<crate::runtime::TurnRan, RuntimeError>> {
        super::turn::turn(self, job, control).boxed()
    }

    fn file_op(
        &mut self,
        request: crate::runtime::FileRequest,
    ) -> BoxFuture<'_, Result<crate::runtime::FileAnswer, RuntimeError>> {
        super::session_files::file_op(self, request).boxed()
    }

    fn checkpoint<'a>(
        &'a mut self,
        image: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        super::checkpoint::checkpoint(&self.docker, &self.name, image).boxed()
    }
}

/// Output kept under the cap, handed to the live sink as it arrives, the init's end marker
/// (stdout) and trailer (stderr) taken out.
struct Pump {
    cap: usize,
    sink: Option<std::sync::Arc<dyn crate::runtime::OutputSink>>,
    stdout: CappedOutput,
    stderr: CappedOutput,
    end: EndMarker,
    trailer: ExitTrailer,
    init_exit: Option<u8>,
}

impl Pump {
    fn new(control: &RunControl, nonce: &str) -> Pump {
        Pump {
            cap: control.output_cap,
            sink: control.sink.clone(),
            stdout: CappedOutput::default(),
            stderr: CappedOutput::default(),
            end: EndMarker::new(nonce),
            trailer: ExitTrailer::new(nonce),
            init_exit: None,
        }
    }

    /// Keeps what fits under the cap and hands exactly that to the live stream.
    fn keep(&mut self, channel: Channel, bytes: &[u8]) {
        let out = match channel {
            Channel::Stdout => &mut self.stdout,
            Channel::Stderr => &mut self.stderr,
        };
        let kept = out.push(bytes, self.cap);
        if let Some(sink) = &self.sink {
            sink.push(channel, kept);
        }
    }

    /// Until the stream ends (`false`) or the init's authenticated end came on both streams
    /// (`true`: nothing of the program is left, see sandbox-init's `quiesce`).
    async fn drain(&mut self, output: &mut Output) -> bool {
        let mut ended = false;
        while let Some(frame) = output.next().await {
            match frame {
                Ok(LogOutput::StdOut { message }) => {
                    let passed = self.end.feed(&message);
                    self.keep(Channel::Stdout, &passed);
                }
                Ok(LogOutput::StdErr { message }) => {
                    let passed = self.trailer.feed(&message);
                    self.keep(Channel::Stderr, &passed);
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "reading sandbox output failed");
                    break;
                }
            }
            // A program that died by SIGKILL (137) may have been the OOM killer's: outside
            // gVisor (runc) the init survives that, so its word is not the whole story and
            // dockerd's flag is waited for as before.
            if self.end.end().is_some()
                && matches!(self.trailer.code(), Some(code) if code != SIGKILLED)
            {
                ended = true;
                break;
            }
        }
        let held = self.end.finish();
        self.keep(Channel::Stdout, &held);
        let (held, code) = self.trailer.finish();
        self.keep(Channel::Stderr, &held);
        self.init_exit = code;
        ended
    }
}

/// Writes the job line and closes stdin. A program that never reads stdin must not stall the
/// hand-over: errors here show up as the program's own failure.
async fn hand_over(input: &mut Input, line: &[u8]) {
    let written = async {
        input.write_all(line).await?;
        input.shutdown().await
    };
    if let Err(err) = written.await {
        tracing::warn!(error = %err, "writing the job to sandbox-init failed");
    }
}

/// The container's exit code once it has stopped.
pub(super) async fn wait_exit(docker: &Docker, name: &str) -> Result<Option<i64>, RuntimeError> {
    match docker.wait_container(name, None).next().await {
        Some(Ok(response)) => Ok(Some(response.status_code)),
        // bollard reports a non-zero exit as an error carrying the code.
        Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(Some(code)),
        Some(Err(err)) => Err(docker_error("wait container", err)),
        None => Ok(None),
    }
}

/// Kills the container; says whether dockerd then reported it stopped.
pub(super) async fn kill(docker: &Docker, name: &str) -> bool {
    let options = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
    if let Err(err) = bounded("kill container", docker.kill_container(name, Some(options))).await {
        tracing::warn!(container = name, error = %err, "kill failed");
    }
    match tokio::time::timeout(KILL_GRACE, wait_exit(docker, name)).await {
        Ok(Ok(Some(_))) => true,
        Ok(_) | Err(_) => {
            tracing::warn!(
                container = name,
                "container did not report its end after SIGKILL"
            );
            false
        }
    }
}

/// Removes the container; says whether it is confirmed gone.
async fn remove(docker: &Docker, name: &str) -> bool {
    match cleanup::remove(docker, name).await {
        Ok(()) => true,
        Err(err) => {
            tracing::error!(container = %name, error = %err, "container left behind for the reaper");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_follow_stop_then_oom_then_the_trailer() {
        assert_eq!(
            ending(Stop::Cancelled, Some(0), true, Some(137)),
            Ending::Cancelled
        );
        assert_eq!(
            ending(Stop::TimedOut, None, false, Some(137)),
            Ending::TimedOut
        );
        assert_eq!(
            ending(Stop::Exited(Some(137)), None, true, Some(137)),
            Ending::Oom { exit: Some(137) }
        );
        assert_eq!(
            ending(Stop::Exited(Some(2)), None, false, Some(2)),
            Ending::Died {
                container_exit: Some(2)
            }
        );
        assert_eq!(
            ending(Stop::Exited(Some(3)), Some(3), false, Some(3)),
            Ending::Exited(3)
        );
        assert_eq!(
            ending(Stop::Exited(None), Some(0), false, None),
            Ending::Exited(0)
        );
    }
}
