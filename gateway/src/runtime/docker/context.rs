//! An extra code context of a session sandbox (E2B's `/contexts`): a second session init
//! started beside PID 1 by `docker exec` as root (`session python|bash context`), which settles
//! into the init's identity as PID 1 does (sandbox-init's `identity`) and serves its own runner
//! over its own channel with its own report key, attached to the exec's stdin, stdout and
//! stderr. Turns go through the same pump as the session's own runner (`super::turn`), with
//! the same nonce-keyed end markers. What differs: an interrupt (deadline, cancel) cannot reach
//! the context's init (its real uid is one nothing else has, and `docker kill` signals PID 1
//! only), so it ends the context instead: its stdin is closed, and its init kills its runner
//! and exits.

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::{FutureExt, StreamExt};
use sandbox_protocol::{ExitTrailer, REPORT_REQUEST};
use tokio::io::AsyncWriteExt;

use super::call::bounded;
use super::run::{Input, Output};
use super::turn::{self, TurnIo};
use crate::runtime::{
    CodeContext, Ending, Job, RunControl, RuntimeError, SessionRunner, TurnEnding, TurnRan,
};

/// How long a new context's init has to answer.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Who the context's init starts as: root, with the container's two capabilities
/// (`CAP_SETUID`, `CAP_SETGID`), which it gives up at once for the init's identity.
const CONTEXT_INIT_USER: &str = "0:0";

/// A running context: its init's exec, attached.
pub(super) struct DockerContext {
    docker: Docker,
    label: String,
    exec: String,
    input: Input,
    output: Output,
}

impl std::fmt::Debug for DockerContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerContext")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Starts the context's init in `container`, hands it the opening line and waits until it
/// answers (a report request): a cwd it cannot enter is the error, with the init's words.
pub(super) async fn open(
    docker: &Docker,
    container: &str,
    runner: SessionRunner,
    mut job: Job<'static>,
) -> Result<DockerContext, RuntimeError> {
    let mut cmd = vec![crate::runtime::INIT_PATH.to_owned()];
    cmd.extend(runner.context_args());
    let options = CreateExecOptions {
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        cmd: Some(cmd),
        privileged: Some(false),
        user: Some(CONTEXT_INIT_USER.to_owned()),
        working_dir: Some("/".to_owned()),
        ..CreateExecOptions::default()
    };
    let created = bounded(
        "create context exec",
        docker.create_exec(container, options),
    )
    .await?;
    let started = bounded(
        "start context exec",
        docker.start_exec(&created.id, Some(StartExecOptions::default())),
    )
    .await?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(RuntimeError::Docker {
            operation: "start context exec",
            message: "dockerd did not attach".to_owned(),
        });
    };
    let mut context = DockerContext {
        docker: docker.clone(),
        label: format!("{container} context {}", created.id),
        exec: created.id,
        input,
        output,
    };
    job.exit_nonce = Some(turn::nonce());
    let opened = turn::write_line(&mut context, &job).await;
    drop(job);
    match context.ready(opened.is_ok()).await {
        Ok(()) => Ok(context),
        Err(said) => Err(RuntimeError::Docker {
            operation: "open the code context",
            message: said,
        }),
    }
}

impl DockerContext {
    /// Asks the init for its report (`sandbox_protocol::REPORT_REQUEST`) and waits for its
    /// answer: it then runs its runner. An init that failed (a cwd it cannot enter) says why
    /// on stderr and ends: that is the error, in its words.
    async fn ready(&mut self, opened: bool) -> Result<(), String> {
        let nonce = turn::nonce();
        let request = Job {
            argv: vec![REPORT_REQUEST.to_owned()],
            cwd: None,
            env: None,
            files: Vec::new(),
            proxy: None,
            exit_nonce: Some(nonce.clone()),
        };
        let asked = opened && turn::write_line(self, &request).await.is_ok();
        let mut trailer = ExitTrailer::new(&nonce);
        let mut said = Vec::new();
        let answer = async {
            while let Some(Ok(frame)) = self.output.next().await {
                if let LogOutput::StdErr { message } = frame {
                    said.extend(trailer.feed(&message));
                    if trailer.code().is_some() {
                        return true;
                    }
                }
            }
            false
        };
        let answered = tokio::time::timeout(READY_WAIT, answer)
            .await
            .unwrap_or(false);
        if asked && answered {
            return Ok(());
        }
        let _ = self.input.shutdown().await;
        // The init's own lines, without its trailer (from its NUL on).
        let text = said.split(|byte| *byte == 0).next().unwrap_or_default();
        let text = String::from_utf8_lossy(text).trim().to_owned();
        Err(if text.is_empty() {
            "the context's init did not answer".to_owned()
        } else {
            text
        })
    }
}

impl TurnIo for DockerContext {
    fn input(&mut self) -> &mut Input {
        &mut self.input
    }

    fn output(&mut self) -> &mut Output {
        &mut self.output
    }

    fn label(&self) -> &str {
        &self.label
    }

    async fn interrupt(&mut self) -> bool {
        self.kill().await;
        false
    }

    async fn kill(&mut self) {
        if let Err(err) = self.input.shutdown().await {
            tracing::warn!(context = %self.label, error = %err, "ending the code context failed");
        }
    }

    async fn ended(&mut self) -> Result<TurnEnding, RuntimeError> {
        let inspected = bounded("inspect context exec", self.docker.inspect_exec(&self.exec)).await;
        let exit = inspected.ok().and_then(|i| i.exit_code);
        Ok(TurnEnding::Ended(Ending::Died {
            container_exit: exit,
        }))
    }
}

impl CodeContext for DockerContext {
    fn turn(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> futures_util::future::BoxFuture<'_, Result<TurnRan, RuntimeError>> {
        turn::turn(self, job, control).boxed()
    }

    fn close(mut self: Box<Self>) -> futures_util::future::BoxFuture<'static, ()> {
        async move {
            self.kill().await;
            // Until its init is gone (its runner killed), at most a moment.
            let drained = async { while let Some(Ok(_)) = self.output.next().await {} };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drained).await;
        }
        .boxed()
    }
}
