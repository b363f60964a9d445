//! `process.Process`, the E2B SDKs' `commands`: a sandbox's processes, several at once (at most
//! [`MAX_PROCESSES`]), each one a session execution started beside the session's runner
//! (`App::start_session_process`: decided with `request.e2b.call: "commands.run"`, recorded
//! before it runs, its output and exit recorded). `Start` and `Connect` stream its events as
//! it prints (`super::follow`); `SendInput`, `StreamInput` and `CloseStdin` reach its stdin;
//! `SendSignal` its process group; `List` shows the running ones. A pid is one sandbox's only
//! (`live`): another sandbox's is `not_found` here and that sandbox is never touched.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::connect::{
    decode, end_stream, envelopes, message, single_envelope, Code, ConnectError, ListResponse,
    ProcessConfig, ProcessInfo, ProcessSelector, Pty, SelectorRequest, SendInputRequest,
    SendSignalRequest, StartRequest, StreamInputRequest, UpdateRequest, STREAM_CONTENT_TYPE,
};
use super::control::reasons_text;
use super::envd::{answer_error, connect_error, json_codec, reach, unary, LiveState, Reached};
use super::follow::{follow, Events};
use super::live::{Running, MAX_FOLLOWERS, MAX_PROCESSES};
use crate::app::session_procs::{ProcessInput, ProcessStart, ProcessStarted};
use crate::app::App;
use crate::runtime::procs::{ProcessSignal, PtySize};
use policy_engine::{E2bCall, E2bInput};

/// Events buffered per stream before the follower waits for the client (bounded memory).
const EVENT_BUFFER: usize = 16;

/// `process.Process/{method}`.
pub async fn process(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(method): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect" | "StreamInput");
    if let Err(err) = json_codec(&parts, streaming) {
        return answer_error(&err, streaming);
    }
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return answer_error(&err, streaming),
    };
    let answered = match method.as_str() {
        "Start" => return start(&app, reached, &parts, &body).await,
        "Connect" => return connect(&app, reached, &parts, &body).await,
        "StreamInput" => return stream_input(&reached, &body).await,
        "List" => Ok(list(&reached)),
        "SendSignal" => send_signal(&app, &reached, &body).await,
        "SendInput" => send_input(&reached, &body).await,
        "CloseStdin" => close_stdin(&reached, &body).await,
        "Update" => update(&reached, &body).await,
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process/{method} is no method of process.Process"),
        )),
    };
    match answered {
        Ok(response) => response,
        Err(err) => answer_error(&err, streaming),
    }
}

fn list(reached: &Reached) -> Response {
    let processes = reached
        .sandbox
        .running()
        .into_iter()
        .map(|(pid, running)| ProcessInfo {
            config: running.config,
            pid,
            tag: running.tag,
        })
        .collect();
    unary(&ListResponse { processes })
}

/// A running process of the call's sandbox, by pid or tag.
fn running_process(
    reached: &Reached,
    selector: ProcessSelector,
) -> Result<(u32, Running), ConnectError> {
    reached
        .sandbox
        .find(selector.pid, selector.tag.as_deref())
        .ok_or_else(|| {
            let which = match (selector.pid, selector.tag) {
                (Some(pid), _) => format!("pid {pid}"),
                (None, Some(tag)) => format!("tag {tag:?}"),
                (None, None) => "(no pid or tag given)".to_owned(),
            };
            ConnectError::new(
                Code::NotFound,
                format!("process {which} is not running in sandbox {}", reached.id),
            )
        })
}

/// The running process's control, once it started.
fn control_of(
    reached: &Reached,
    selector: Option<ProcessSelector>,
) -> Result<Arc<crate::app::session_procs::ProcessControl>, ConnectError> {
    let (pid, running) = running_process(reached, selector.unwrap_or_default())?;
    running.control.ok_or_else(|| still_deciding(pid))
}

fn still_deciding(pid: u32) -> ConnectError {
    ConnectError::new(
        Code::FailedPrecondition,
        format!("process {pid} is still being decided; try again once it started"),
    )
}

/// `SendSignal`: `SIGKILL` (recorded `killed`) or `SIGTERM`, to the process's group.
async fn send_signal(app: &App, reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: SendSignalRequest = decode(body)?;
    let signal = match request.signal.as_ref() {
        Some(serde_json::Value::String(name)) if name == "SIGNAL_SIGKILL" => ProcessSignal::Kill,
        Some(serde_json::Value::String(name)) if name == "SIGNAL_SIGTERM" => ProcessSignal::Term,
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(9) => ProcessSignal::Kill,
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(15) => ProcessSignal::Term,
        other => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("signal {other:?} is not SIGNAL_SIGTERM or SIGNAL_SIGKILL"),
            ))
        }
    };
    let control = control_of(reached, request.process)?;
    app.signal_session_process(&control, signal)
        .await
        .map_err(connect_error)?;
    Ok(unary(&serde_json::json!({})))
}

/// `Update`: a PTY process's terminal gets a new size (the program gets `SIGWINCH`).
async fn update(reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: UpdateRequest = decode(body)?;
    let control = control_of(reached, request.process)?;
    let Some(pty) = request.pty else {
        // Nothing to change: envd answers such an update the same way.
        return Ok(unary(&serde_json::json!({})));
    };
    if !control.is_pty() {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            "this process has no PTY to resize",
        ));
    }
    control
        .send_input(ProcessInput::Resize(pty.checked_size()?))
        .await
        .map_err(connect_error)?;
    Ok(unary(&serde_json::json!({})))
}

/// `SendInput`: bytes for the process's stdin (a PTY process's terminal).
async fn send_input(reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: SendInputRequest = decode(body)?;
    let control = control_of(reached, request.process)?;
    let bytes = request
        .input
        .unwrap_or_default()
        .bytes_for(control.is_pty())?;
    control
        .send_input(ProcessInput::Data(bytes))
        .await
        .map_err(connect_error)?;
    Ok(unary(&serde_json::json!({})))
}

/// `CloseStdin`: the process reads the end of its input.
async fn close_stdin(reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: SelectorRequest = decode(body)?;
    let control = control_of(reached, request.process)?;
    control
        .send_input(ProcessInput::Close)
        .await
        .map_err(connect_error)?;
    Ok(unary(&serde_json::json!({})))
}

/// `StreamInput` (a client stream): its start names the process, its data events are stdin.
/// The whole request body is read first (at most the listener's body limit).
async fn stream_input(reached: &Reached, body: &[u8]) -> Response {
    let fed = async {
        let mut control = None;
        for data in envelopes(body)? {
            let request: StreamInputRequest = decode(data)?;
            if let Some(start) = request.start {
                control = Some(control_of(reached, start.process)?);
            }
            if let Some(data) = request.data {
                let Some(control) = &control else {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "StreamInput sent data before its start event",
                    ));
                };
                let bytes = data.input.unwrap_or_default().bytes_for(control.is_pty())?;
                control
                    .send_input(ProcessInput::Data(bytes))
                    .await
                    .map_err(connect_error)?;
            }
        }
        Ok::<(), ConnectError>(())
    };
    match fed.await {
        Ok(()) => {
            let mut answer = message(&serde_json::json!({})).to_vec();
            answer.extend_from_slice(&end_stream(None));
            (
                StatusCode::OK,
                [(CONTENT_TYPE, STREAM_CONTENT_TYPE)],
                answer,
            )
                .into_response()
        }
        Err(err) => answer_error(&err, true),
    }
}

async fn start(app: &Arc<App>, reached: Reached, parts: &Parts, body: &[u8]) -> Response {
    let (pid, execution_id, pty) = match prepare(app, &reached, parts, body).await {
        Ok(started) => started,
        Err(err) => return answer_error(&err, true),
    };
    let keepalive = keepalive_interval(parts);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(EVENT_BUFFER);
    let following = Arc::clone(app);
    app.tasks.spawn(async move {
        let events = Events {
            tx: &tx,
            keepalive,
            pty,
        };
        follow(&following, &reached, pid, &execution_id, &events).await;
        reached.sandbox.ended(pid);
    });
    event_stream(rx)
}

/// `Connect`: the events of a running process of this sandbox, from its start (what it printed
/// so far, then what follows).
async fn connect(app: &Arc<App>, reached: Reached, parts: &Parts, body: &[u8]) -> Response {
    let found = single_envelope(body)
        .and_then(decode::<SelectorRequest>)
        .and_then(|request| running_process(&reached, request.process.unwrap_or_default()));
    let (pid, execution_id, pty) = match found {
        Ok((pid, running)) => match running.execution_id {
            Some(execution_id) => (pid, execution_id, running.pty),
            None => return answer_error(&still_deciding(pid), true),
        },
        Err(err) => return answer_error(&err, true),
    };
    let Some(follower) = reached.sandbox.follower() else {
        let err = ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "sandbox {} already has {MAX_FOLLOWERS} connections following its processes",
                reached.id
            ),
        );
        return answer_error(&err, true);
    };
    let keepalive = keepalive_interval(parts);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(EVENT_BUFFER);
    let following = Arc::clone(app);
    app.tasks.spawn(async move {
        let events = Events {
            tx: &tx,
            keepalive,
            pty,
        };
        follow(&following, &reached, pid, &execution_id, &events).await;
        drop(follower);
    });
    event_stream(rx)
}

/// A server stream of the events a follower sends.
fn event_stream(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    (
        StatusCode::OK,
        [(CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Decides, records and starts the process; its pid, execution id, and whether it runs on a
/// terminal.
async fn prepare(
    app: &Arc<App>,
    reached: &Reached,
    parts: &Parts,
    body: &[u8],
) -> Result<(u32, String, bool), ConnectError> {
    let request: StartRequest = decode(single_envelope(body)?)?;
    let stdin = request.stdin == Some(true);
    let (config, tag, pty) = supported(request)?;
    let call = if pty.is_some() {
        E2bCall::PtyCreate
    } else {
        E2bCall::CommandsRun
    };
    let mut env = reached.sandbox.envs.clone();
    env.extend(config.envs.clone());
    let start = ProcessStart {
        shown: shown(&config),
        argv: process_argv(&config)?,
        env,
        cwd: crate::runtime::WORKSPACE.to_owned(),
        stdin: stdin && pty.is_none(),
        pty,
        timeout_ms: connect_timeout_ms(parts),
        e2b: Some(E2bInput {
            call: Some(call),
            ..E2bInput::default()
        }),
    };
    let Some(pid) = reached.sandbox.start(config, tag, pty.is_some()) else {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "sandbox {} already runs {MAX_PROCESSES} processes; wait for one to end",
                reached.id
            ),
        ));
    };
    let started = app
        .start_session_process(&reached.key, &reached.id, start)
        .await;
    match started {
        Ok(ProcessStarted::Running(row, control)) => {
            reached.sandbox.started_as(pid, &row.id, control);
            Ok((pid, row.id, pty.is_some()))
        }
        Ok(ProcessStarted::Denied(row)) => {
            reached.sandbox.ended(pid);
            Err(ConnectError::new(
                Code::PermissionDenied,
                format!(
                    "the policy denied this command (execution {}): {}",
                    row.id,
                    reasons_text(&row.reasons.0)
                ),
            ))
        }
        Err(err) => {
            reached.sandbox.ended(pid);
            Err(connect_error(err))
        }
    }
}

/// The process of a start request, its tag and its terminal's size, when sandgate can run it.
fn supported(
    request: StartRequest,
) -> Result<(ProcessConfig, Option<String>, Option<PtySize>), ConnectError> {
    let pty = request.pty.as_ref().map(Pty::checked_size).transpose()?;
    let config = request
        .process
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "StartRequest has no process"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "the process has no cmd",
        ));
    }
    Ok((config, request.tag, pty))
}

/// What runs: a `sh` that changes into the process's working directory (given: it must
/// exist; else `/home/user`, a writable place of every sandbox), then `exec`s the
/// program with its arguments exactly as given.
fn process_argv(config: &ProcessConfig) -> Result<Vec<String>, ConnectError> {
    let mut argv = vec!["/bin/sh".to_owned(), "-c".to_owned()];
    match &config.cwd {
        Some(cwd) if cwd.contains('\0') => {
            return Err(ConnectError::new(Code::InvalidArgument, "cwd holds NUL"))
        }
        Some(cwd) => {
            argv.push(r#"cd -- "$0" || exit 1; exec "$@""#.to_owned());
            argv.push(cwd.clone());
        }
        None => {
            argv.push(format!(
                r#"cd -- {} || exit 1; exec "$@""#,
                crate::runtime::USER_HOME
            ));
            argv.push("sh".to_owned());
        }
    }
    argv.push(config.cmd.clone());
    argv.extend(config.args.iter().cloned());
    if argv.iter().any(|arg| arg.contains('\0')) {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "the command holds NUL",
        ));
    }
    Ok(argv)
}

/// The process as its record shows it: the program and its arguments, shell-quoted, in its
/// working directory (env values are not stored: they may hold secrets).
fn shown(config: &ProcessConfig) -> String {
    let quote = |text: &str| format!("'{}'", text.replace('\'', r"'\''"));
    let argv: Vec<String> = std::iter::once(&config.cmd)
        .chain(&config.args)
        .map(|arg| quote(arg))
        .collect();
    let names: Vec<&str> = config.envs.keys().map(String::as_str).collect();
    let mut shown = String::new();
    if let Some(cwd) = &config.cwd {
        shown.push_str(&format!("cd -- {}\n", quote(cwd)));
    }
    if !names.is_empty() {
        shown.push_str(&format!("# envs: {}\n", names.join(" ")));
    }
    shown.push_str(&argv.join(" "));
    shown.push('\n');
    shown
}

fn connect_timeout_ms(parts: &Parts) -> Option<u64> {
    parts
        .headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .filter(|ms| *ms > 0)
}

/// `Keepalive-Ping-Interval` (seconds): how often the SDK wants a keepalive event.
fn keepalive_interval(parts: &Parts) -> Option<Duration> {
    parts
        .headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_process_runs_in_its_cwd_exactly_as_given() {
        let config = ProcessConfig {
            cmd: "/bin/bash".to_owned(),
            args: vec!["-l".to_owned(), "-c".to_owned(), "echo 'hi' $X".to_owned()],
            envs: BTreeMap::from([("X".to_owned(), "secret".to_owned())]),
            cwd: Some("/tmp".to_owned()),
        };
        assert_eq!(
            process_argv(&config).unwrap(),
            [
                "/bin/sh",
                "-c",
                r#"cd -- "$0" || exit 1; exec "$@""#,
                "/tmp",
                "/bin/bash",
                "-l",
                "-c",
                "echo 'hi' $X"
            ]
        );
        let shown = shown(&config);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.ends_with("'/bin/bash' '-l' '-c' 'echo '\\''hi'\\'' $X'\n"));
    }

    #[test]
    fn a_command_without_cmd_is_refused() {
        let request = StartRequest {
            process: Some(ProcessConfig::default()),
            ..StartRequest::default()
        };
        assert!(supported(request).is_err());
    }
}
