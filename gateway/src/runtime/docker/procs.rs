//! A session's later processes through `docker exec` (see `runtime::procs`): the attach
//! supervisor as the program's user, attached to its stdin, stdout and stderr; its exit code
//! from the exec's record; signals through a second, short exec.

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::StreamExt;
use sandbox_protocol::{attach_argv, signal_argv, watch_argv, ProcessSignal, PROGRAM_USER};

use super::call::bounded;
use crate::runtime::procs::{ProcessSpec, StartedProcess, WatchSpec};
use crate::runtime::{Channel, RuntimeError};

/// Starts the process's attach supervisor, attached.
pub(super) async fn start(
    docker: &Docker,
    container: &str,
    spec: ProcessSpec,
) -> Result<StartedProcess, RuntimeError> {
    // A terminal's exec stdin is its supervisor's control channel, always attached.
    let stdin = spec.stdin || spec.pty.is_some();
    let exec = Exec {
        cmd: attach_argv(&spec.tag, spec.pty, &spec.argv),
        env: spec.env,
        cwd: spec.cwd,
        stdin,
    };
    attached(docker, container, exec).await
}

/// Starts a directory watcher, attached (its stdin carries its requests).
pub(super) async fn start_watcher(
    docker: &Docker,
    container: &str,
    spec: WatchSpec,
) -> Result<StartedProcess, RuntimeError> {
    let exec = Exec {
        cmd: watch_argv(&spec.tag, spec.recursive, &spec.path),
        env: Vec::new(),
        cwd: "/".to_owned(),
        stdin: true,
    };
    attached(docker, container, exec).await
}

/// What one attached exec runs.
struct Exec {
    cmd: Vec<String>,
    env: Vec<String>,
    cwd: String,
    stdin: bool,
}

/// Runs `exec` as the program's user, attached to its stdout and stderr (and stdin).
async fn attached(
    docker: &Docker,
    container: &str,
    exec: Exec,
) -> Result<StartedProcess, RuntimeError> {
    let options = CreateExecOptions {
        attach_stdin: Some(exec.stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: Some(exec.env),
        cmd: Some(exec.cmd),
        privileged: Some(false),
        user: Some(PROGRAM_USER.to_owned()),
        working_dir: Some(exec.cwd),
        detach_keys: None,
    };
    let created = bounded(
        "create process exec",
        docker.create_exec(container, options),
    )
    .await?;
    let started = bounded(
        "start process exec",
        docker.start_exec(&created.id, Some(StartExecOptions::default())),
    )
    .await?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(RuntimeError::Docker {
            operation: "start process exec",
            message: "dockerd did not attach".to_owned(),
        });
    };
    let output = output
        .filter_map(|frame| async move {
            match frame {
                Ok(LogOutput::StdOut { message }) => Some(Ok((Channel::Stdout, message.to_vec()))),
                Ok(LogOutput::StdErr { message }) => Some(Ok((Channel::Stderr, message.to_vec()))),
                Ok(_) => None,
                Err(err) => Some(Err(err.to_string())),
            }
        })
        .boxed();
    Ok(StartedProcess {
        handle: created.id,
        output,
        input: exec.stdin.then_some(input),
    })
}

/// The exit code of a process whose output ended; `None` while dockerd says it still runs.
pub(super) async fn exit(docker: &Docker, handle: &str) -> Result<Option<i64>, RuntimeError> {
    let inspected = bounded("inspect process exec", docker.inspect_exec(handle)).await?;
    if inspected.running == Some(true) {
        return Ok(None);
    }
    Ok(inspected.exit_code)
}

/// Signals the process of `tag`; whether one ran.
pub(super) async fn signal(
    docker: &Docker,
    container: &str,
    tag: &str,
    signal: ProcessSignal,
) -> Result<bool, RuntimeError> {
    let options = CreateExecOptions {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(signal_argv(tag, signal)),
        user: Some(PROGRAM_USER.to_owned()),
        ..CreateExecOptions::default()
    };
    let created = bounded("create signal exec", docker.create_exec(container, options)).await?;
    let started = bounded(
        "start signal exec",
        docker.start_exec(&created.id, Some(StartExecOptions::default())),
    )
    .await?;
    if let StartExecResults::Attached { mut output, .. } = started {
        while output.next().await.is_some() {}
    }
    for _ in 0..50 {
        if let Some(code) = exit(docker, &created.id).await? {
            return Ok(code == 0);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(false)
}
