//! A session sandbox's turns: the opening line, then one turn at a time on the held stdin,
//! each pumped until the runner's end markers on both streams (see `sandbox_protocol`'s
//! session module), the deadline or a cancel.

use std::time::{Duration, Instant};

use base64::Engine as _;
use bollard::container::LogOutput;
use bollard::query_parameters::KillContainerOptionsBuilder;
use futures_util::StreamExt;
use sandbox_protocol::{EndMarker, ExitTrailer, RichResults, TurnEnd, REPORT_REQUEST};
use tokio::io::AsyncWriteExt;

use super::call::bounded;
use super::run::{kill, wait_exit, DockerSandbox, Input, Output, Stop};
use crate::runtime::{
    CappedOutput, Channel, Ending, Job, OutputSink, RunControl, RuntimeError, TurnEnding, TurnRan,
};

/// After an interrupt: how long the runner has to answer before the sandbox is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// How long the init has to answer a report request after a turn.
const REPORT_WAIT: Duration = Duration::from_secs(5);
/// Extra one-second looks for dockerd's OOM flag after a SIGKILL end of a session.
const OOM_LATE_POLLS: u32 = 3;
/// After the output ended under a turn: how long to wait for dockerd to report the exit.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Writes the opening line; stdin stays open for the turns.
pub(super) async fn open(
    sandbox: &mut impl TurnIo,
    mut job: Job<'static>,
) -> Result<(), RuntimeError> {
    job.exit_nonce = Some(nonce());
    write_line(sandbox, &job).await
}

/// What a turn is pumped through: the container's own attach (its PID 1 serves the session's
/// runner) or an extra code context's exec (`super::context`).
pub(super) trait TurnIo: Send {
    fn input(&mut self) -> &mut Input;
    fn output(&mut self) -> &mut Output;
    fn label(&self) -> &str;
    /// Interrupts the running cell; `false`: it cannot be interrupted and was ended instead
    /// (the turn then ends unrecovered at once).
    fn interrupt(&mut self) -> impl std::future::Future<Output = bool> + Send;
    /// Ends it: the runner did not answer within the grace after an interrupt.
    fn kill(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// The output ended under a turn: how.
    fn ended(
        &mut self,
    ) -> impl std::future::Future<Output = Result<TurnEnding, RuntimeError>> + Send;
}

impl TurnIo for DockerSandbox {
    fn input(&mut self) -> &mut Input {
        &mut self.input
    }

    fn output(&mut self) -> &mut Output {
        &mut self.output
    }

    fn label(&self) -> &str {
        &self.name
    }

    async fn interrupt(&mut self) -> bool {
        signal(&self.docker, &self.name, "SIGINT").await;
        true
    }

    async fn kill(&mut self) {
        kill(&self.docker, &self.name).await;
    }

    async fn ended(&mut self) -> Result<TurnEnding, RuntimeError> {
        sandbox_ended(self).await
    }
}

/// One turn, to its ending.
pub(super) async fn turn(
    sandbox: &mut impl TurnIo,
    mut job: Job<'static>,
    control: RunControl,
) -> Result<TurnRan, RuntimeError> {
    let nonce = nonce();
    job.exit_nonce = Some(nonce.clone());
    let started_at = crate::ids::now_micros();
    let started = Instant::now();
    write_line(sandbox, &job).await?;
    drop(job);
    let mut pump = TurnPump::new(&control, &nonce);
    let ending = pump_turn(sandbox, &mut pump, &control).await?;
    let special_files = if ending.session_lives() {
        report(sandbox).await
    } else {
        Vec::new()
    };
    Ok(TurnRan {
        ending,
        stdout: pump.stdout,
        stderr: pump.stderr,
        special_files,
        started_at,
        duration: started.elapsed(),
    })
}

pub(super) fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

pub(super) async fn write_line(
    sandbox: &mut impl TurnIo,
    job: &Job<'static>,
) -> Result<(), RuntimeError> {
    let mut line = serde_json::to_vec(job).map_err(|err| RuntimeError::Docker {
        operation: "encode turn",
        message: err.to_string(),
    })?;
    line.push(b'\n');
    let written = async {
        sandbox.input().write_all(&line).await?;
        sandbox.input().flush().await
    };
    written.await.map_err(|err| RuntimeError::Docker {
        operation: "hand the turn to the session",
        message: err.to_string(),
    })
}

/// Asks the init what `/output` holds that the host cannot see (sandbox-init's `leftovers`)
/// and waits for its answer, an exit trailer for a fresh nonce on stderr. What else the
/// sandbox prints meanwhile belongs to no turn and is dropped. No answer in time: nothing.
async fn report(sandbox: &mut impl TurnIo) -> Vec<String> {
    let nonce = nonce();
    let request = Job {
        argv: vec![REPORT_REQUEST.to_owned()],
        cwd: None,
        env: None,
        files: Vec::new(),
        proxy: None,
        exit_nonce: Some(nonce.clone()),
    };
    if let Err(err) = write_line(sandbox, &request).await {
        tracing::warn!(container = %sandbox.label(), error = %err, "asking the session's init for its report failed");
        return Vec::new();
    }
    let mut trailer = ExitTrailer::new(&nonce);
    let output = sandbox.output();
    let answer = async {
        while let Some(Ok(frame)) = output.next().await {
            if let LogOutput::StdErr { message } = frame {
                trailer.feed(&message);
                if trailer.code().is_some() {
                    return;
                }
            }
        }
    };
    if tokio::time::timeout(REPORT_WAIT, answer).await.is_err() {
        tracing::warn!(container = %sandbox.label(), "the session's init did not answer its report request");
    }
    trailer.report().special_files.clone()
}

/// Why the turn was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    Deadline,
    Cancel,
}

/// Pumps until both markers came; interrupts at the deadline or on cancel; kills the sandbox
/// when the runner does not answer within the grace after that.
async fn pump_turn(
    sandbox: &mut impl TurnIo,
    pump: &mut TurnPump,
    control: &RunControl,
) -> Result<TurnEnding, RuntimeError> {
    let deadline = tokio::time::Instant::now() + control.timeout;
    let mut interrupted: Option<(Interrupt, tokio::time::Instant)> = None;
    loop {
        let wake = interrupted.map_or(deadline, |(_, at)| at + INTERRUPT_GRACE);
        tokio::select! {
            frame = sandbox.output().next() => match frame {
                Some(Ok(frame)) => {
                    if let Some(end) = pump.feed(frame) {
                        return Ok(answered(end, interrupted.map(|(why, _)| why)));
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "reading session output failed");
                    return output_ended(sandbox, interrupted.map(|(why, _)| why)).await;
                }
                None => return output_ended(sandbox, interrupted.map(|(why, _)| why)).await,
            },
            () = tokio::time::sleep_until(wake) => match interrupted {
                None => {
                    if !sandbox.interrupt().await {
                        return Ok(unrecovered(Interrupt::Deadline));
                    }
                    interrupted = Some((Interrupt::Deadline, tokio::time::Instant::now()));
                }
                Some((why, _)) => {
                    sandbox.kill().await;
                    return Ok(unrecovered(why));
                }
            },
            () = control.cancel.cancelled(), if interrupted.is_none() => {
                if !sandbox.interrupt().await {
                    return Ok(unrecovered(Interrupt::Cancel));
                }
                interrupted = Some((Interrupt::Cancel, tokio::time::Instant::now()));
            }
        }
    }
}

fn answered(end: TurnEnd, interrupted: Option<Interrupt>) -> TurnEnding {
    match interrupted {
        Some(Interrupt::Deadline) => TurnEnding::TimedOut { recovered: true },
        Some(Interrupt::Cancel) => TurnEnding::Cancelled { recovered: true },
        None => {
            let result = (!end.result_b64.is_empty())
                .then(|| {
                    base64::engine::general_purpose::STANDARD
                        .decode(&end.result_b64)
                        .ok()
                })
                .flatten()
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            TurnEnding::Exited {
                code: end.code,
                result,
                results: rich_results(&end.results_b64),
            }
        }
    }
}

/// The cell's rich results, from the runner's report; ones that do not decode are dropped
/// (they are the interpreter's, as the `repr` is).
fn rich_results(results_b64: &str) -> Option<RichResults> {
    if results_b64.is_empty() {
        return None;
    }
    let json = base64::engine::general_purpose::STANDARD
        .decode(results_b64)
        .ok()?;
    match serde_json::from_slice(&json) {
        Ok(results) => Some(results),
        Err(err) => {
            tracing::warn!(error = %err, "a cell's rich results did not decode");
            None
        }
    }
}

fn unrecovered(why: Interrupt) -> TurnEnding {
    match why {
        Interrupt::Deadline => TurnEnding::TimedOut { recovered: false },
        Interrupt::Cancel => TurnEnding::Cancelled { recovered: false },
    }
}

/// The output ended under the turn: after an interrupt, unrecovered; else as the io says.
async fn output_ended(
    sandbox: &mut impl TurnIo,
    interrupted: Option<Interrupt>,
) -> Result<TurnEnding, RuntimeError> {
    match interrupted {
        Some(why) => Ok(unrecovered(why)),
        None => sandbox.ended().await,
    }
}

/// The output ended under the turn: the sandbox is gone (or going); dockerd says how.
async fn sandbox_ended(sandbox: &mut DockerSandbox) -> Result<TurnEnding, RuntimeError> {
    // As for a run: the exit first (its code), then dockerd's OOM flag, which can trail it.
    let exit = tokio::time::timeout(EXIT_WAIT, wait_exit(&sandbox.docker, &sandbox.name))
        .await
        .unwrap_or(Ok(None))?;
    let mut ending = sandbox.inspect(Stop::Exited(exit), None).await?;
    // Under load dockerd's OOM flag can trail a SIGKILL end by more than `inspect`'s own wait;
    // a session is closed by what this says (`oom` or `crashed`), so look a little longer.
    for _ in 0..OOM_LATE_POLLS {
        if ending
            != (Ending::Died {
                container_exit: Some(137),
            })
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        ending = sandbox.inspect(Stop::Exited(exit), None).await?;
    }
    Ok(TurnEnding::Ended(ending))
}

/// Sends a signal to the init, which forwards it to the runner's process group.
async fn signal(docker: &bollard::Docker, container: &str, name: &str) {
    let options = KillContainerOptionsBuilder::new().signal(name).build();
    if let Err(err) = bounded(
        "signal container",
        docker.kill_container(container, Some(options)),
    )
    .await
    {
        tracing::warn!(container, error = %err, "interrupting the session failed");
    }
}

/// One turn's output under the cap, the end markers taken out of both streams.
struct TurnPump {
    cap: usize,
    sink: Option<std::sync::Arc<dyn OutputSink>>,
    stdout: CappedOutput,
    stderr: CappedOutput,
    stdout_marker: EndMarker,
    stderr_marker: EndMarker,
}

impl TurnPump {
    fn new(control: &RunControl, nonce: &str) -> TurnPump {
        TurnPump {
            cap: control.output_cap,
            sink: control.sink.clone(),
            stdout: CappedOutput::default(),
            stderr: CappedOutput::default(),
            stdout_marker: EndMarker::new(nonce),
            stderr_marker: EndMarker::new(nonce),
        }
    }

    /// Feeds a frame; the stdout marker's end once both markers came.
    fn feed(&mut self, frame: LogOutput) -> Option<TurnEnd> {
        match frame {
            LogOutput::StdOut { message } => {
                let passed = self.stdout_marker.feed(&message);
                self.keep(Channel::Stdout, &passed);
            }
            LogOutput::StdErr { message } => {
                let passed = self.stderr_marker.feed(&message);
                self.keep(Channel::Stderr, &passed);
            }
            _ => {}
        }
        match (self.stdout_marker.end(), self.stderr_marker.end()) {
            (Some(end), Some(_)) => Some(end.clone()),
            _ => None,
        }
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_after_an_interrupt_say_the_session_recovered() {
        let end = TurnEnd {
            code: 0,
            result_b64: "NDI=".into(),
            // {"results":[],"truncated":true}
            results_b64: "eyJyZXN1bHRzIjpbXSwidHJ1bmNhdGVkIjp0cnVlfQ==".into(),
        };
        assert_eq!(
            answered(end.clone(), None),
            TurnEnding::Exited {
                code: 0,
                result: Some("42".into()),
                results: Some(RichResults {
                    results: Vec::new(),
                    truncated: true
                }),
            }
        );
        assert_eq!(
            answered(end, Some(Interrupt::Deadline)),
            TurnEnding::TimedOut { recovered: true }
        );
        assert!(!unrecovered(Interrupt::Cancel).session_lives());
        assert!(!TurnEnding::Ended(Ending::Oom { exit: None }).session_lives());
    }
}
