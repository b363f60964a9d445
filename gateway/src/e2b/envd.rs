//! envd, the in-sandbox API, as the E2B SDKs reach it through `E2B_SANDBOX_URL`: every call
//! names its sandbox (`E2b-Sandbox-Id`) and carries that sandbox's access token
//! (`X-Access-Token`), checked against the hashes issued for that one sandbox; the sandbox id
//! alone is never trusted. Commands run as the sandbox's owner key, each one a session
//! execution (`request.e2b.call: "commands.run"`): decided, recorded before it runs, its
//! output and exit recorded, then answered as `process.Process/Start`'s event stream.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::connect::{
    decode, end_stream, single_envelope, Code, ConnectError, ListResponse, ProcessConfig,
    ProcessInfo, SelectorRequest, SendSignalRequest, StartRequest, STREAM_CONTENT_TYPE,
    UNARY_CONTENT_TYPE,
};
use super::control::reasons_text;
use super::follow::{follow, Events};
use super::live::{Live, LiveSandbox, Running};
use super::refuse;
use crate::app::refusals::RefusalKind;
use crate::app::sessions::SessionExecutionRequest;
use crate::app::{App, AppError};
use crate::audit::{ApiKey, ExecutionRow};
use crate::session_wire::TurnLimits;
use policy_engine::{E2bCall, E2bInput};

/// The working directory E2B's SDKs assume, when it exists in the image; else the
/// sandbox's writable `/workspace`.
pub(super) const E2B_HOME: &str = "/home/user";
/// Events buffered per stream before the follower waits for the client (bounded memory).
const EVENT_BUFFER: usize = 16;
/// Longest wait for a finished command's session to be released.
const SETTLE: Duration = Duration::from_secs(2);

pub(super) type LiveState = Extension<Arc<Live>>;

/// A call's sandbox, by its id and access token.
pub(super) struct Reached {
    pub(super) id: String,
    pub(super) key: ApiKey,
    pub(super) sandbox: Arc<LiveSandbox>,
}

fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

pub(super) async fn reach(
    app: &App,
    live: &Arc<Live>,
    parts: &Parts,
) -> Result<Reached, ConnectError> {
    let Some(id) = header(parts, "e2b-sandbox-id") else {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "no E2b-Sandbox-Id header: which sandbox is this call for?",
        ));
    };
    let Some(token) = header(parts, "x-access-token") else {
        let _ = refuse(
            app,
            parts,
            RefusalKind::AuthFailure,
            None,
            "e2b.access_token_missing",
        )
        .await;
        return Err(ConnectError::new(
            Code::Unauthenticated,
            format!("no X-Access-Token: calls to sandbox {id} need the access token its create or connect answer gave"),
        ));
    };
    let found = app.audit.e2b_by_token(id, token).await.map_err(|err| {
        tracing::error!(error = %crate::errors::error_chain(&err), "access token lookup failed");
        ConnectError::new(Code::Unavailable, "the audit store is unavailable")
    })?;
    let Some((row, key)) = found else {
        let _ = refuse(
            app,
            parts,
            RefusalKind::AuthFailure,
            None,
            "e2b.access_token_invalid",
        )
        .await;
        return Err(ConnectError::new(
            Code::Unauthenticated,
            format!("the access token is not valid for sandbox {id}"),
        ));
    };
    let sandbox = match live.get(id) {
        Some(sandbox) => sandbox,
        // Served by another replica until now, or this gateway restarted: no envVars here.
        None => live.insert(
            id,
            LiveSandbox::new(key.clone(), BTreeMap::new(), row.end_at),
        ),
    };
    Ok(Reached {
        id: id.to_owned(),
        key,
        sandbox,
    })
}

/// `GET /health`: 204 while the sandbox's session is open, 502 once it is gone (what the SDKs'
/// `is_running` reads as "not running").
pub async fn health(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return unary_error(&err),
    };
    match app.get_session(&reached.key, &reached.id).await {
        Ok(row) if !row.is(crate::session_wire::SessionStatus::Closed) => {
            StatusCode::NO_CONTENT.into_response()
        }
        _ => (
            StatusCode::BAD_GATEWAY,
            format!("sandbox {} is not running", reached.id),
        )
            .into_response(),
    }
}

/// `GET /envs`: the sandbox's `envVars` (given at create; only its token's holder sees them).
pub async fn envs(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
) -> Response {
    match reach(&app, &live, &parts).await {
        Ok(reached) => Json(&reached.sandbox.envs).into_response(),
        Err(err) => unary_error(&err),
    }
}

/// `process.Process/{method}`.
pub async fn process(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(method): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect");
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
        "List" => Ok(list(&reached)),
        "SendSignal" => send_signal(&app, &reached, &body).await,
        "SendInput" | "StreamInput" | "CloseStdin" | "Update" => Err(ConnectError::new(
            Code::Unimplemented,
            format!(
                "process.Process/{method} is not supported by sandgate yet: commands run without \
                 stdin or PTY (docs/e2b.md)"
            ),
        )),
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

/// Only Connect's JSON codec: what the E2B SDKs send.
pub(super) fn json_codec(parts: &Parts, streaming: bool) -> Result<(), ConnectError> {
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let expected = if streaming {
        STREAM_CONTENT_TYPE
    } else {
        UNARY_CONTENT_TYPE
    };
    if media.eq_ignore_ascii_case(expected) {
        return Ok(());
    }
    Err(ConnectError::new(
        Code::InvalidArgument,
        format!(
            "content-type {media:?} is not accepted here: send {expected} (Connect's JSON codec)"
        ),
    ))
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

/// `SendSignal`: SIGTERM or SIGKILL cancel the command's session execution.
async fn send_signal(app: &App, reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: SendSignalRequest = decode(body)?;
    let (pid, running) = running_process(reached, request.process.unwrap_or_default())?;
    let Some(execution) = running.execution_id else {
        return Err(still_deciding(pid));
    };
    app.cancel_execution(&reached.key, &execution)
        .await
        .map_err(connect_error)?;
    Ok(unary(&serde_json::json!({})))
}

async fn start(app: &Arc<App>, reached: Reached, parts: &Parts, body: &[u8]) -> Response {
    let prepared = prepare(app, &reached, parts, body).await;
    let (pid, row) = match prepared {
        Ok(started) => started,
        Err(err) => return answer_error(&err, true),
    };
    let keepalive = keepalive_interval(parts);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(EVENT_BUFFER);
    let following = Arc::clone(app);
    app.tasks.spawn(async move {
        let events = Events { tx: &tx, keepalive };
        follow(&following, &reached, pid, &row.id, &events).await;
        reached.sandbox.ended(pid);
    });
    event_stream(rx)
}

/// `Connect`: the events of a running process of this sandbox, from its start (what it printed
/// so far, then what follows). A pid of another sandbox is never one of this one's
/// (`live::LiveSandbox::start`): `not_found`, and that sandbox is not touched.
async fn connect(app: &Arc<App>, reached: Reached, parts: &Parts, body: &[u8]) -> Response {
    let found = single_envelope(body)
        .and_then(decode::<SelectorRequest>)
        .and_then(|request| running_process(&reached, request.process.unwrap_or_default()));
    let (pid, execution_id) = match found {
        Ok((pid, running)) => match running.execution_id {
            Some(execution_id) => (pid, execution_id),
            None => return answer_error(&still_deciding(pid), true),
        },
        Err(err) => return answer_error(&err, true),
    };
    let Some(follower) = reached.sandbox.follower() else {
        let err = ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "sandbox {} already has {} connections following its processes",
                reached.id,
                super::live::MAX_FOLLOWERS
            ),
        );
        return answer_error(&err, true);
    };
    let keepalive = keepalive_interval(parts);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(EVENT_BUFFER);
    let following = Arc::clone(app);
    app.tasks.spawn(async move {
        let events = Events { tx: &tx, keepalive };
        follow(&following, &reached, pid, &execution_id, &events).await;
        drop(follower);
    });
    event_stream(rx)
}

/// A running process of the call's sandbox, by pid or tag.
fn running_process(
    reached: &Reached,
    selector: super::connect::ProcessSelector,
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

fn still_deciding(pid: u32) -> ConnectError {
    ConnectError::new(
        Code::FailedPrecondition,
        format!("process {pid} is still being decided; try again once it started"),
    )
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

/// Decides and records the command (a session execution); its pid and record once started.
async fn prepare(
    app: &Arc<App>,
    reached: &Reached,
    parts: &Parts,
    body: &[u8],
) -> Result<(u32, ExecutionRow), ConnectError> {
    let request: StartRequest = decode(single_envelope(body)?)?;
    let (config, tag) = supported(request)?;
    let script = command_script(&config, &reached.sandbox.envs)?;
    let language = app
        .get_session(&reached.key, &reached.id)
        .await
        .map_err(connect_error)?
        .language;
    let code = if language == "python" {
        python_wrapper(&script)
    } else {
        script
    };
    let execution = SessionExecutionRequest {
        code,
        limits: TurnLimits {
            timeout_ms: connect_timeout_ms(parts),
        },
        wait: Some(false),
        e2b: Some(E2bInput {
            call: Some(E2bCall::CommandsRun),
            ..E2bInput::default()
        }),
        ..SessionExecutionRequest::default()
    };
    let pid = reached.sandbox.start(config, tag);
    let row = app
        .create_session_execution(&reached.key, &reached.id, execution)
        .await;
    let row = match row {
        Ok(row) if row.allow => row,
        Ok(row) => {
            reached.sandbox.ended(pid);
            return Err(ConnectError::new(
                Code::PermissionDenied,
                format!(
                    "the policy denied this command (execution {}): {}",
                    row.id,
                    reasons_text(&row.reasons.0)
                ),
            ));
        }
        Err(err) => {
            reached.sandbox.ended(pid);
            return Err(connect_error(err));
        }
    };
    reached.sandbox.started_as(pid, &row.id);
    Ok((pid, row))
}

/// The process of a start request, and its tag, when sandgate can run it.
fn supported(request: StartRequest) -> Result<(ProcessConfig, Option<String>), ConnectError> {
    if request.pty.as_ref().is_some_and(|pty| !pty.is_null()) {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "PTY processes are not supported by sandgate's E2B API yet",
        ));
    }
    if request.stdin == Some(true) {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "commands with stdin are not supported by sandgate's E2B API yet: run them with stdin=False",
        ));
    }
    let config = request
        .process
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "StartRequest has no process"))?;
    Ok((config, request.tag))
}

/// Waits (at most [`SETTLE`]) until the session no longer counts as busy: its record is
/// finished a moment before the session is released, and the SDK's next call (a command, a
/// file operation) would otherwise find it busy.
pub(super) async fn settled(app: &App, reached: &Reached) {
    let deadline = tokio::time::Instant::now() + SETTLE;
    while tokio::time::Instant::now() < deadline {
        match app.get_session(&reached.key, &reached.id).await {
            Ok(row) if row.is(crate::session_wire::SessionStatus::Busy) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            _ => return,
        }
    }
}

/// The bash the session runs for one process: in a subshell (nothing it does outlives it in
/// the session's shell), in its working directory, with the sandbox's and the call's envs,
/// `exec`ing the program with its arguments exactly as given.
fn command_script(
    config: &ProcessConfig,
    sandbox_envs: &BTreeMap<String, String>,
) -> Result<String, ConnectError> {
    if config.cmd.is_empty() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "the process has no cmd",
        ));
    }
    let mut script = String::from("(\n");
    match &config.cwd {
        Some(cwd) => script.push_str(&format!("cd -- {} || exit 1\n", quote(cwd))),
        None => script.push_str(&format!(
            "cd -- {home} 2>/dev/null || cd -- {}\n",
            crate::runtime::WORKSPACE,
            home = E2B_HOME
        )),
    }
    let mut envs = sandbox_envs.clone();
    envs.extend(config.envs.clone());
    for (name, value) in &envs {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
        if !valid {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("{name:?} is not a valid environment variable name"),
            ));
        }
        script.push_str(&format!("export {}\n", quote(&format!("{name}={value}"))));
    }
    let argv: Vec<String> = std::iter::once(&config.cmd)
        .chain(&config.args)
        .map(|a| quote(a))
        .collect();
    script.push_str(&format!("exec {}\n)\n", argv.join(" ")));
    Ok(script)
}

/// A python session runs the same bash as a child, its exit the cell's (`SystemExit`).
fn python_wrapper(script: &str) -> String {
    let literal = serde_json::to_string(script).unwrap_or_default();
    format!(
        "import subprocess as __sandgate_e2b\nraise SystemExit(__sandgate_e2b.call(['/bin/bash', '-c', {literal}], stdin=__sandgate_e2b.DEVNULL))\n"
    )
}

/// Single-quoted for bash.
pub(super) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
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

pub(super) fn connect_error(err: AppError) -> ConnectError {
    let code = match &err {
        AppError::Invalid(_) | AppError::NoSuggestion(_) => Code::InvalidArgument,
        AppError::NotFound | AppError::NotFoundWhy(_) => Code::NotFound,
        AppError::Forbidden(_) => Code::PermissionDenied,
        // One command at a time in a sandbox (its session runs one execution at a time).
        AppError::Conflict(_) | AppError::RevisionConflict(_) => Code::FailedPrecondition,
        AppError::RateLimited(_) => Code::ResourceExhausted,
        AppError::Unavailable(_) | AppError::ReplicaUnavailable(_) => Code::Unavailable,
        AppError::Internal(_) => Code::Internal,
    };
    let message = match err {
        AppError::Unavailable(_) => "the audit store is unavailable".to_owned(),
        AppError::Internal(_) => "internal error".to_owned(),
        other => other.to_string(),
    };
    ConnectError::new(code, message)
}

pub(super) fn unary<T: serde::Serialize>(value: &T) -> Response {
    (
        StatusCode::OK,
        [(CONTENT_TYPE, UNARY_CONTENT_TYPE)],
        serde_json::to_vec(value).unwrap_or_default(),
    )
        .into_response()
}

pub(super) fn unary_error(err: &ConnectError) -> Response {
    (
        err.code.http_status(),
        [(CONTENT_TYPE, UNARY_CONTENT_TYPE)],
        err.to_json().to_string(),
    )
        .into_response()
}

/// A stream's error is its end-of-stream message, with HTTP 200 (Connect's streaming rule).
pub(super) fn answer_error(err: &ConnectError, streaming: bool) -> Response {
    if !streaming {
        return unary_error(err);
    }
    (
        StatusCode::OK,
        [(CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        end_stream(Some(err)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_in_a_subshell_with_its_cwd_and_envs() {
        let config = ProcessConfig {
            cmd: "/bin/bash".to_owned(),
            args: vec!["-l".to_owned(), "-c".to_owned(), "echo 'hi' $X".to_owned()],
            envs: BTreeMap::from([("X".to_owned(), "it's".to_owned())]),
            cwd: Some("/tmp".to_owned()),
        };
        let script = command_script(&config, &BTreeMap::new()).unwrap();
        assert_eq!(
            script,
            "(\ncd -- '/tmp' || exit 1\nexport 'X=it'\\''s'\nexec '/bin/bash' '-l' '-c' 'echo '\\''hi'\\'' $X'\n)\n"
        );
    }

    #[test]
    fn an_env_name_that_is_no_name_is_refused() {
        let config = ProcessConfig {
            cmd: "true".to_owned(),
            envs: BTreeMap::from([("A;rm".to_owned(), "x".to_owned())]),
            ..ProcessConfig::default()
        };
        assert!(command_script(&config, &BTreeMap::new()).is_err());
    }
}
