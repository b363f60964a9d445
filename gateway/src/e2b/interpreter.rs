//! The code interpreter's API on its port (49999, `E2b-Sandbox-Port`), as the
//! `e2b-code-interpreter` SDK calls it: `POST /execute` runs one cell as a session execution
//! (`request.e2b.call: "run_code"`: decided by the policy, recorded before it runs, its output,
//! exit and rich results recorded) in the sandbox's resident Python runner, whose state
//! carries from cell to cell, and answers E2B's result lines (one JSON object a line):
//! `stdout`, `stderr`, `result` (E2B's `Result` fields, `is_main_result`), `error` (`name`,
//! `value`, `traceback`, taken from the traceback the runner prints), `number_of_executions`.
//! `stdout` lines are sent as the cell writes them (the execution's live stream); the rest once
//! the cell ended and its record is stored (stderr whole, so that a traceback becomes the
//! `error` line, not stderr). `language: "bash"` runs the cell with bash (`bash -c` as a child of
//! the runner in a Python sandbox); other languages are refused.
//!
//! Code contexts (`/contexts`, `app::contexts`): the sandbox's default context is its
//! session's runner (listed as `default`); `create_code_context` starts another interpreter
//! (python or bash, in a cwd) with its own state in the same sandbox, at most
//! [`crate::app::contexts::MAX_CONTEXTS`] of them; a cell with `context_id` runs there, still a session execution
//! with `request.e2b.context` naming it. The interpreter SDK sends its `/contexts` calls with
//! the sandbox's token as `E2B-Traffic-Access-Token` only (the create answer's
//! `trafficAccessToken`, the same token): these routes take either header
//! (`envd::reach_interpreter`), and nothing without one. `env_vars` on a cell answer 501: the
//! runner has no per-cell environment.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::control::reasons_text;
use super::envd::{reach_interpreter as reach, LiveState, Reached};
use super::error::E2bError;
use crate::app::contexts::ContextInfo;
use crate::app::sessions::SessionExecutionRequest;
use crate::app::stream::StreamEvent;
use crate::app::App;
use crate::audit::ExecutionRow;
use crate::runtime::SessionRunner;
use crate::status::ExecutionStatus;
use policy_engine::{E2bCall, E2bInput};

/// How often a finished cell's record is looked for.
const POLL: Duration = Duration::from_millis(50);

/// The body of `POST /execute`.
#[derive(Debug, Deserialize)]
pub struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

/// What a cell is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CellLanguage {
    Python,
    Bash,
}

/// `POST /execute`.
pub async fn execute(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
    body: Bytes,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return E2bError::new(err.code.http_status(), err.message).into_response(),
    };
    let row = match run_cell(&app, &reached, &body).await {
        Ok(row) => row,
        Err(err) => return err.into_response(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let following = Arc::clone(&app);
    app.tasks
        .spawn(async move { follow(&following, &reached, row, &tx).await });
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), rx))
    });
    (
        StatusCode::OK,
        [(CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// Sends the cell's stdout as it comes, then, once its record is stored, the rest.
async fn follow(
    app: &App,
    reached: &Reached,
    row: ExecutionRow,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) {
    let mut sent = String::new();
    // Opened before the turn started; gone already if the cell ended meanwhile (the record
    // then has it all).
    if let Some(stream) = app.streams.get(&row.id) {
        let mut from = 0;
        let mut pending = String::new();
        while let Some(batch) = stream.next_batch(from).await {
            from += batch.len();
            for event in batch {
                if let StreamEvent::Stdout(text) = event {
                    pending.push_str(&text);
                    let Some(whole) = whole_lines(&pending) else {
                        continue;
                    };
                    let line = json!({"type": "stdout", "text": whole, "timestamp": now_nanos()});
                    let _ = tx.send(Bytes::from(format!("{line}\n"))).await;
                    sent.push_str(whole);
                    let taken = whole.len();
                    pending.drain(..taken);
                }
            }
        }
    }
    let mut row = row;
    while row.finished_at.is_none() {
        tokio::time::sleep(POLL).await;
        match app.get_execution(&reached.key, &row.id).await {
            Ok(now) => row = now,
            Err(err) => {
                let line = json!({"type": "error", "name": "SandgateError",
                    "value": format!("following the cell failed: {err}"), "traceback": ""});
                let _ = tx.send(Bytes::from(format!("{line}\n"))).await;
                return;
            }
        }
    }
    super::envd::settled(app, reached).await;
    let count = executions(app, reached).await;
    let _ = tx.send(Bytes::from(result_lines(&row, count, &sent))).await;
}

/// Longest stdout held back waiting for its line's end.
const MAX_PARTIAL_LINE: usize = 64 * 1024;

/// What of `pending` to send now: up to its last newline (E2B's interpreter sends whole
/// lines: a `print` whose text and newline arrive apart is one message), or all of it past
/// [`MAX_PARTIAL_LINE`]. The rest goes with the cell's final lines.
fn whole_lines(pending: &str) -> Option<&str> {
    match pending.rfind('\n') {
        Some(end) => Some(&pending[..=end]),
        None if pending.len() > MAX_PARTIAL_LINE => Some(pending),
        None => None,
    }
}

fn now_nanos() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
}

/// The id the sandbox's default context (its session's runner) is listed with.
const DEFAULT_CONTEXT: &str = "default";
/// Where a context starts when the call names no cwd (E2B's default).
const DEFAULT_CWD: &str = "/home/user";

/// The body of `POST /contexts`.
#[derive(Debug, Default, Deserialize)]
pub struct CreateContextRequest {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `POST /contexts`: a new context; `GET /contexts`: the default one and the others.
pub async fn contexts(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
    body: Bytes,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return E2bError::new(err.code.http_status(), err.message).into_response(),
    };
    let answered = match parts.method {
        axum::http::Method::GET => list_contexts(&app, &reached).await,
        axum::http::Method::POST => create_context(&app, &reached, &body).await,
        _ => Err(E2bError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "/contexts takes GET (list) and POST (create)",
        )),
    };
    answered.unwrap_or_else(IntoResponse::into_response)
}

/// `DELETE /contexts/{id}` and `POST /contexts/{id}/restart`.
pub async fn context(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    axum::extract::Path(rest): axum::extract::Path<String>,
    parts: Parts,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return E2bError::new(err.code.http_status(), err.message).into_response(),
    };
    let (id, action) = match rest.split_once('/') {
        Some((id, action)) => (id, Some(action)),
        None => (rest.as_str(), None),
    };
    let (key, sandbox) = (&reached.key, reached.id.as_str());
    let done = match (&parts.method, action) {
        _ if id == DEFAULT_CONTEXT => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "the default context is the sandbox's own runner: it is neither removed nor \
             restarted (kill the sandbox, or use a context of your own)",
        )),
        (&axum::http::Method::DELETE, None) => app
            .remove_context(key, sandbox, id)
            .await
            .map_err(E2bError::from),
        (&axum::http::Method::POST, Some("restart")) => app
            .restart_context(key, sandbox, id)
            .await
            .map_err(E2bError::from),
        _ => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "{} {}: no such code interpreter route",
                parts.method,
                parts.uri.path()
            ),
        )),
    };
    match done {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => err.into_response(),
    }
}

async fn list_contexts(app: &App, reached: &Reached) -> Result<Response, E2bError> {
    let session = app.get_session(&reached.key, &reached.id).await?;
    let mut listed = vec![json!({"id": DEFAULT_CONTEXT, "language": session.language,
        "cwd": DEFAULT_CWD})];
    let extra = app.list_contexts(&reached.key, &reached.id).await?;
    listed.extend(extra.iter().map(context_json));
    Ok(axum::Json(listed).into_response())
}

async fn create_context(app: &App, reached: &Reached, body: &[u8]) -> Result<Response, E2bError> {
    let request: CreateContextRequest = if body.is_empty() {
        CreateContextRequest::default()
    } else {
        serde_json::from_slice(body).map_err(|err| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("malformed /contexts body: {err}"),
            )
        })?
    };
    let runner = match cell_language(request.language.as_deref())? {
        CellLanguage::Python => SessionRunner::Python,
        CellLanguage::Bash => SessionRunner::Bash,
    };
    let cwd = request.cwd.as_deref().unwrap_or(DEFAULT_CWD);
    let info = app
        .create_context(&reached.key, &reached.id, runner, cwd)
        .await?;
    Ok(axum::Json(context_json(&info)).into_response())
}

/// E2B's `Context`.
fn context_json(info: &ContextInfo) -> Value {
    let language = match info.runner {
        SessionRunner::Python => "python",
        SessionRunner::Bash => "bash",
    };
    json!({"id": info.id, "language": language, "cwd": info.cwd})
}

/// Decides, records and runs the cell; its finished record.
async fn run_cell(
    app: &Arc<App>,
    reached: &Reached,
    body: &[u8],
) -> Result<ExecutionRow, E2bError> {
    let request: ExecuteRequest = serde_json::from_slice(body).map_err(|err| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("malformed /execute body: {err}"),
        )
    })?;
    let context = request
        .context_id
        .filter(|c| !c.is_empty() && c != DEFAULT_CONTEXT);
    if request.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(E2bError::new(
            StatusCode::NOT_IMPLEMENTED,
            "envs on run_code are not supported by sandgate's E2B API: the runner has no \
             per-cell environment (set them in the code, or as the sandbox's envs for commands)",
        ));
    }
    let code = match &context {
        // The cell is the context's language (the SDK sends no `language` with a context).
        Some(context) => {
            in_context(app, reached, context, request.language.as_deref()).await?;
            request.code
        }
        None => {
            let cell = cell_language(request.language.as_deref())?;
            let session = app.get_session(&reached.key, &reached.id).await?;
            cell_code(cell, &session.language, request.code)?
        }
    };
    let execution = SessionExecutionRequest {
        code,
        e2b: Some(E2bInput {
            call: Some(E2bCall::RunCode),
            context,
            ..E2bInput::default()
        }),
        wait: Some(false),
        ..SessionExecutionRequest::default()
    };
    let row = app
        .create_session_execution(&reached.key, &reached.id, execution)
        .await?;
    if !row.allow || row.status == ExecutionStatus::Denied {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the policy denied this cell (execution {}): {}",
                row.id,
                reasons_text(&row.reasons.0)
            ),
        ));
    }
    Ok(row)
}

/// A cell for context `context`: the sandbox has it (E2B's 404 "Context ... not found"
/// otherwise, also for another sandbox's context), and names no other language.
async fn in_context(
    app: &App,
    reached: &Reached,
    context: &str,
    language: Option<&str>,
) -> Result<(), E2bError> {
    let runner = app
        .context_runner(&reached.key, &reached.id, context)
        .await?;
    let asked = match language {
        None | Some("") => return Ok(()),
        Some(language) => cell_language(Some(language))?,
    };
    let fits = matches!(
        (asked, runner),
        (CellLanguage::Python, SessionRunner::Python) | (CellLanguage::Bash, SessionRunner::Bash)
    );
    if fits {
        return Ok(());
    }
    Err(E2bError::new(
        StatusCode::BAD_REQUEST,
        "only one of context_id or language can be given (the cell runs in the context's language)",
    ))
}

fn cell_language(language: Option<&str>) -> Result<CellLanguage, E2bError> {
    match language.map(str::to_ascii_lowercase).as_deref() {
        None | Some("" | "python" | "python3") => Ok(CellLanguage::Python),
        Some("bash" | "sh") => Ok(CellLanguage::Bash),
        Some(other) => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("language {other:?} is not supported by sandgate's E2B API: python or bash"),
        )),
    }
}

/// The code the session runs for the cell: Python as is in a Python sandbox, bash as is in a
/// bash one, bash as a child of the Python runner (its exit the cell's).
fn cell_code(cell: CellLanguage, session: &str, code: String) -> Result<String, E2bError> {
    match (cell, session) {
        (CellLanguage::Python, "python") | (CellLanguage::Bash, "bash") => Ok(code),
        (CellLanguage::Bash, "python") => {
            let literal = serde_json::to_string(&code).unwrap_or_default();
            Ok(format!(
                "import subprocess as __sandgate_cell\nraise SystemExit(__sandgate_cell.call(['/bin/bash', '-c', {literal}], stdin=__sandgate_cell.DEVNULL))\n"
            ))
        }
        (cell, session) => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "this sandbox's runner is {session}: {cell:?} cells need the code-interpreter-v1 template"
            ),
        )),
    }
}

/// Executions run in the sandbox so far (E2B's execution count).
async fn executions(app: &App, reached: &Reached) -> i64 {
    app.get_session(&reached.key, &reached.id)
        .await
        .map_or(0, |row| row.executions)
}

/// E2B's result lines for a finished cell, less the stdout already `sent`.
fn result_lines(row: &ExecutionRow, count: i64, sent: &str) -> String {
    let timestamp = row
        .finished_at
        .and_then(|t| t.timestamp_nanos_opt())
        .unwrap_or_default();
    let stdout = String::from_utf8_lossy(row.stdout.as_deref().unwrap_or_default());
    let stdout = match stdout.strip_prefix(sent) {
        Some(rest) => rest.to_owned(),
        // The live stream dropped output (`app::stream`'s bounds): the record's is whole, but
        // what was sent cannot be taken back.
        None => String::new(),
    };
    let stderr = String::from_utf8_lossy(row.stderr.as_deref().unwrap_or_default()).into_owned();
    let failed = row.status != ExecutionStatus::Succeeded;
    let (stderr, error) = if failed {
        split_error(&stderr, row)
    } else {
        (stderr, None)
    };
    let mut lines: Vec<Value> = Vec::new();
    if !stdout.is_empty() {
        lines.push(json!({"type": "stdout", "text": stdout, "timestamp": timestamp}));
    }
    if !stderr.is_empty() {
        lines.push(json!({"type": "stderr", "text": stderr, "timestamp": timestamp}));
    }
    for result in row.results.iter().flat_map(|r| r.0.results.iter()) {
        let mut line = serde_json::to_value(result).unwrap_or_else(|_| json!({}));
        if let Some(object) = line.as_object_mut() {
            object.insert("type".to_owned(), json!("result"));
        }
        lines.push(line);
    }
    if let Some(error) = error {
        lines.push(error);
    }
    lines.push(json!({"type": "number_of_executions", "execution_count": count}));
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// A failed cell's stderr before the traceback, and E2B's `error` line: the exception's name
/// and value from the traceback's last line, or the cell's ending when it printed none.
fn split_error(stderr: &str, row: &ExecutionRow) -> (String, Option<Value>) {
    const HEAD: &str = "Traceback (most recent call last):";
    if let Some(at) = stderr.rfind(HEAD) {
        let traceback = stderr[at..].trim_end().to_owned();
        let last = traceback.lines().last().unwrap_or_default();
        let (name, value) = match last.split_once(": ") {
            Some((name, value)) if !name.contains(' ') => (name, value),
            _ => (last, ""),
        };
        let error = json!({"type": "error", "name": name, "value": value, "traceback": traceback});
        return (stderr[..at].to_owned(), Some(error));
    }
    let value = match (row.exit_code, &row.error) {
        (_, Some(error)) => error.clone(),
        (Some(code), None) => format!("exit status {code}"),
        (None, None) => format!("the cell ended: {}", row.status),
    };
    let error = json!({"type": "error", "name": "ExecutionError", "value": value, "traceback": ""});
    (stderr.to_owned(), Some(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_is_sent_in_whole_lines() {
        assert_eq!(whole_lines("late"), None);
        assert_eq!(whole_lines("late\n"), Some("late\n"));
        assert_eq!(whole_lines("a\nb\nc"), Some("a\nb\n"));
        let long = "x".repeat(MAX_PARTIAL_LINE + 1);
        assert_eq!(whole_lines(&long), Some(long.as_str()));
    }

    #[test]
    fn languages_map_onto_the_session_s_runner() {
        assert_eq!(cell_language(None).unwrap(), CellLanguage::Python);
        assert_eq!(cell_language(Some("bash")).unwrap(), CellLanguage::Bash);
        assert!(cell_language(Some("r")).is_err());
        assert_eq!(
            cell_code(CellLanguage::Python, "python", "1".into()).unwrap(),
            "1"
        );
        assert!(cell_code(CellLanguage::Bash, "python", "echo 'a'".into())
            .unwrap()
            .contains("['/bin/bash', '-c', \"echo 'a'\"]"));
        assert!(cell_code(CellLanguage::Python, "bash", "1".into()).is_err());
    }
}
