//! `sandgate exec`: a small client for humans. It creates an execution (`wait: false`), prints
//! its stdout and stderr as they arrive through `GET /v1/executions/{id}/events`, cancels it
//! on Ctrl-C (`exec_until`), optionally downloads its output files (only as new regular files:
//! `save`), and exits with the program's exit code. `http://` or `https://` (reqwest with
//! rustls; `ca_file` adds a private CA to the system roots).

mod cells;
pub mod repl;
pub mod save;
pub mod sessions;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use api_types::{
    ErrorCode, ExecutionRequest, ExecutionStatus, ExecutionView, ExitEvent, FileUpload, HostPort,
    OutputEvent, RequestedLimits, SessionExecutionRequest, StreamEventName, TurnLimits,
};
use base64::Engine as _;
use reqwest::Method;
use tokio_util::sync::CancellationToken;

use sessions::{ApiClient, CallError};

/// Exit codes for endings that carry no program exit code.
const EXIT_TIMEOUT: i32 = 124;
const EXIT_KILLED: i32 = 137;
pub const EXIT_CANCELLED: i32 = 130;
const EXIT_DENIED: i32 = 77;
const EXIT_ERROR: i32 = 70;

/// How often a request waiting for human review is looked at again.
const APPROVAL_POLL: Duration = Duration::from_secs(2);

/// What to run, and where.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// `http://host:port` or `https://host:port` of the gateway.
    pub url: String,
    /// A CA certificate (PEM) to trust beside the system roots, and a client certificate to
    /// present, for `https://`.
    pub tls: TlsFiles,
    pub key: String,
    pub language: String,
    pub code: String,
    /// Files to upload: (path under /workspace, content).
    pub files: Vec<(String, Vec<u8>)>,
    pub network: Vec<(String, u16)>,
    pub mounts: Vec<String>,
    pub timeout_ms: Option<u64>,
    /// Where to download `/output` files to, if anywhere.
    pub output_dir: Option<PathBuf>,
    /// Run in this open session (`POST /v1/sessions/{id}/executions`) instead.
    pub session: Option<String>,
    /// Whether existing files may be replaced and dot-files written there.
    pub save: save::SaveOptions,
}

type HttpClient = reqwest::Client;

/// The files an `https://` gateway may need: a private CA to trust, and a client certificate
/// with its key (PEM) for a gateway configured with `tls.client_ca_file`.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The HTTP client of the command-line tools, trusting `tls.ca_file` beside the system roots
/// and presenting `tls.client_cert` when the server asks for one.
pub fn http_client(tls: &TlsFiles) -> anyhow::Result<HttpClient> {
    let mut builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
    if let Some(path) = &tls.ca_file {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("{}: not a PEM certificate", path.display()))?;
        builder = builder.add_root_certificate(ca);
    }
    if let Some((cert, key)) = &tls.client_cert {
        builder = builder.identity(identity(cert, key)?);
    }
    builder.build().context("building the HTTP client")
}

/// A client certificate (chain) and its private key, both PEM, as one identity.
fn identity(cert: &Path, key: &Path) -> anyhow::Result<reqwest::Identity> {
    let mut pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    pem.push(b'\n');
    pem.extend(std::fs::read(key).with_context(|| format!("reading {}", key.display()))?);
    reqwest::Identity::from_pem(&pem).with_context(|| {
        format!(
            "{} and {}: want a PEM certificate and its PEM private key",
            cert.display(),
            key.display()
        )
    })
}

/// `base` checked: the tools speak to `http://` or `https://` gateways only.
pub fn check_url(url: &str) -> anyhow::Result<&str> {
    let base = url.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        bail!("--url must be an http:// or https:// URL of the gateway (got {base:?})");
    }
    Ok(base)
}

/// Runs one execution; returns the exit code `sandgate exec` should exit with.
pub async fn exec(
    request: &ExecRequest,
    stdout: &mut (dyn Write + Send),
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    exec_until(request, stdout, stderr, &CancellationToken::new()).await
}

/// [`exec`], cancelling the execution on the gateway once `cancel` fires (Ctrl-C): a running
/// one is stopped, one held for review is withdrawn, and the run still ends as the gateway
/// recorded it (`cancelled`: [`EXIT_CANCELLED`]).
pub async fn exec_until(
    request: &ExecRequest,
    stdout: &mut (dyn Write + Send),
    stderr: &mut (dyn Write + Send),
    cancel: &CancellationToken,
) -> anyhow::Result<i32> {
    let base = check_url(&request.url)?;
    let api = ApiClient::new(http_client(&request.tls)?, base, &request.key);
    if let Some(session) = &request.session {
        let target = (base, session.as_str());
        return exec_in_session(&api, request, target, (stdout, stderr), cancel).await;
    }
    let body = ExecutionRequest {
        files: uploads(&request.files),
        network: request
            .network
            .iter()
            .map(|(host, port)| HostPort {
                host: host.clone(),
                port: *port,
            })
            .collect(),
        mounts: request.mounts.clone(),
        limits: RequestedLimits {
            timeout_ms: request.timeout_ms,
            ..RequestedLimits::default()
        },
        wait: false,
        ..ExecutionRequest::new(&request.language, &request.code)
    };
    let created: ExecutionView = match api.call(Method::POST, "/v1/executions", Some(&body)).await {
        Ok(created) => created,
        Err(err) => return denied_or(err, stderr),
    };
    let id = created.id;
    writeln!(stderr, "sandgate: execution {id}")?;
    // Whether the execution was already asked to cancel (withdrawn while held for review).
    let mut asked = false;
    if created.status == ExecutionStatus::PendingApproval {
        let approval = created.approval_id.as_deref().unwrap_or("?");
        writeln!(
            stderr,
            "sandgate: {id} waits for human review (approval {approval})"
        )?;
        asked = wait_for_review(&api, &id, cancel, stderr).await?;
    }

    let summary = follow(&api, base, &id, (stdout, stderr), (cancel, asked)).await?;
    if let Some(dir) = &request.output_dir {
        download_outputs(&api, request, base, &id, dir, stderr).await?;
    }
    if summary.stdout_truncated || summary.stderr_truncated {
        writeln!(
            stderr,
            "sandgate: output was truncated at the execution's output limit"
        )?;
    }
    exit_code_for(summary.status, summary.exit_code, &id, stderr)
}

/// The files to upload, as the API takes them.
fn uploads(files: &[(String, Vec<u8>)]) -> Vec<FileUpload> {
    let b64 = base64::engine::general_purpose::STANDARD;
    files
        .iter()
        .map(|(path, content)| FileUpload {
            path: path.clone(),
            content_b64: b64.encode(content),
        })
        .collect()
}

/// A policy denial printed with its reasons (exit [`EXIT_DENIED`]); any other failure as is.
fn denied_or(err: CallError, stderr: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    match err {
        CallError::Api {
            code: Some(ErrorCode::PolicyDenied),
            reasons,
            ..
        } => {
            writeln!(stderr, "sandgate: denied by policy")?;
            for reason in reasons {
                writeln!(stderr, "  {}: {}", reason.code, reason.message)?;
            }
            Ok(EXIT_DENIED)
        }
        err => Err(err.into()),
    }
}

/// Polls the record until a reviewer decided (or the approval expired), or `cancel` withdrew
/// the request (`true`).
async fn wait_for_review(
    api: &ApiClient,
    id: &str,
    cancel: &CancellationToken,
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<bool> {
    let path = format!("/v1/executions/{}", encode_path(id));
    loop {
        tokio::select! {
            () = tokio::time::sleep(APPROVAL_POLL) => {}
            () = cancel.cancelled() => {
                request_cancel(api, id, stderr).await?;
                return Ok(true);
            }
        }
        let record: ExecutionView = api.call::<_, ()>(Method::GET, &path, None).await?;
        if record.status != ExecutionStatus::PendingApproval {
            return Ok(false);
        }
    }
}

/// `POST /v1/executions/{id}/cancel`. One that already ended is no error (its ending is
/// printed anyway); another failure is printed, and the run is followed to its end as is.
async fn request_cancel(
    api: &ApiClient,
    id: &str,
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    writeln!(stderr, "\nsandgate: cancelling execution {id}")?;
    let path = format!("/v1/executions/{}/cancel", encode_path(id));
    match api
        .call::<ExecutionView, ()>(Method::POST, &path, None)
        .await
    {
        Ok(_) => {}
        Err(err) if err.code() == Some(ErrorCode::Conflict) => {}
        Err(err) => writeln!(stderr, "sandgate: could not cancel {id}: {err}")?,
    }
    Ok(())
}

/// The exit code `sandgate exec` ends with, from how the execution ended.
fn exit_code_for(
    ended: ExecutionStatus,
    exit_code: Option<i32>,
    id: &str,
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    Ok(match ended {
        ExecutionStatus::Succeeded | ExecutionStatus::Failed => exit_code.unwrap_or(EXIT_ERROR),
        other => {
            writeln!(stderr, "sandgate: execution {id} ended: {other}")?;
            match other {
                ExecutionStatus::Timeout => EXIT_TIMEOUT,
                ExecutionStatus::Oom | ExecutionStatus::Killed => EXIT_KILLED,
                ExecutionStatus::Cancelled => EXIT_CANCELLED,
                ExecutionStatus::Denied => EXIT_DENIED,
                _ => EXIT_ERROR,
            }
        }
    })
}

/// `sandgate exec --session ID`: one execution in an open session, answered when it ended;
/// prints its output, then (python) the final expression's `repr` on stdout. `cancel`
/// interrupts the session's running execution (the session goes on).
async fn exec_in_session(
    api: &ApiClient,
    request: &ExecRequest,
    (base, session): (&str, &str),
    (stdout, stderr): (&mut (dyn Write + Send), &mut (dyn Write + Send)),
    cancel: &CancellationToken,
) -> anyhow::Result<i32> {
    let body = SessionExecutionRequest {
        code: request.code.clone(),
        files: uploads(&request.files),
        limits: TurnLimits {
            timeout_ms: request.timeout_ms,
        },
        wait: None,
        e2b: None,
    };
    let run = api.run(session, &body);
    tokio::pin!(run);
    let ran = tokio::select! {
        ran = &mut run => ran,
        () = cancel.cancelled() => {
            writeln!(stderr, "\nsandgate: interrupting the execution running in {session}")?;
            if let Err(err) = api.interrupt(session).await {
                writeln!(stderr, "sandgate: could not interrupt it: {err}")?;
            }
            run.await
        }
    };
    let run = match ran {
        Ok(run) => run,
        Err(err) => return denied_or(err, stderr),
    };
    stdout.write_all(run.stdout.as_bytes())?;
    stderr.write_all(run.stderr.as_bytes())?;
    if let Some(result) = &run.result {
        writeln!(stdout, "{result}")?;
    }
    stdout.flush()?;
    if let Some(dir) = &request.output_dir {
        download_outputs(api, request, base, &run.id, dir, stderr).await?;
    }
    exit_code_for(run.status, run.exit_code, &run.id, stderr)
}

/// Prints the event stream as it arrives; returns the `exit` event's data. Once `cancel`
/// fires, the execution is cancelled (unless it was `asked` already) and the stream followed
/// to the end it then has.
async fn follow(
    api: &ApiClient,
    base: &str,
    id: &str,
    (stdout, stderr): (&mut (dyn Write + Send), &mut (dyn Write + Send)),
    (cancel, asked): (&CancellationToken, bool),
) -> anyhow::Result<ExitEvent> {
    let url = format!("{base}/v1/executions/{}/events", encode_path(id));
    let mut response = api.get_raw(&url).await?;
    let mut buffer: Vec<u8> = Vec::new();
    let mut cancelled = asked;
    loop {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk.context("reading the event stream")?,
            () = cancel.cancelled(), if !cancelled => {
                cancelled = true;
                request_cancel(api, id, stderr).await?;
                continue;
            }
        };
        let Some(data) = chunk else {
            bail!("the event stream of {id} ended without an exit event")
        };
        buffer.extend_from_slice(&data);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..end + 2).collect();
            if let Some(exit) = print_event(id, &block, stdout, stderr)? {
                return Ok(exit);
            }
        }
    }
}

/// Prints one SSE block of the stream; `Some` for the `exit` event.
fn print_event(
    id: &str,
    block: &[u8],
    stdout: &mut (dyn Write + Send),
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<Option<ExitEvent>> {
    let (name, data) = parse_event(&String::from_utf8_lossy(block));
    let event = |data: &str| {
        serde_json::from_str::<OutputEvent>(data)
            .with_context(|| format!("an output event of {id} is not {{\"text\"}}"))
    };
    match name {
        Some(StreamEventName::Stdout) => {
            stdout.write_all(event(&data)?.text.as_bytes())?;
            stdout.flush()?;
        }
        Some(StreamEventName::Stderr) => {
            stderr.write_all(event(&data)?.text.as_bytes())?;
            stderr.flush()?;
        }
        Some(StreamEventName::Exit) => {
            let exit = serde_json::from_str(&data)
                .with_context(|| format!("the exit event of {id} is not readable"))?;
            return Ok(Some(exit));
        }
        None => {}
    }
    Ok(None)
}

/// An SSE block's event name (when it is one of the stream's) and its data.
fn parse_event(block: &str) -> (Option<StreamEventName>, String) {
    let mut name = String::from("message");
    let mut data = String::new();
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            name = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    (StreamEventName::parse(&name), data)
}

async fn download_outputs(
    api: &ApiClient,
    request: &ExecRequest,
    base: &str,
    id: &str,
    dir: &Path,
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let path = format!("/v1/executions/{}", encode_path(id));
    let record: ExecutionView = api.call::<_, ()>(Method::GET, &path, None).await?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for output in &record.outputs {
        let path = output.path.as_str();
        // Checked before anything is fetched: the manifest comes from a sandbox.
        if let Err(why) = save::check_name(path, request.save) {
            writeln!(stderr, "sandgate: not written: {path:?}: {why}")?;
            continue;
        }
        let url = format!("{base}/v1/executions/{id}/outputs/{}", encode_path(path));
        let response = match api.get_raw(&url).await {
            Ok(response) => response,
            Err(err) => {
                writeln!(stderr, "sandgate: could not download {path}: {err}")?;
                continue;
            }
        };
        let bytes = response.bytes().await.context("reading an output file")?;
        match save::save(dir, path, &bytes, request.save) {
            Ok(target) => writeln!(
                stderr,
                "sandgate: wrote {} ({} bytes)",
                target.display(),
                bytes.len()
            )?,
            Err(why) => writeln!(stderr, "sandgate: not written: {path:?}: {why}")?,
        }
    }
    for skipped in &record.outputs_skipped {
        writeln!(
            stderr,
            "sandgate: not collected: {} ({})",
            skipped.path, skipped.reason
        )?;
    }
    Ok(())
}

/// Percent-encodes everything but unreserved characters and `/`.
pub fn encode_path(path: &str) -> String {
    path.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_paths_encode() {
        let (name, data) = parse_event("event: stdout\ndata: {\"text\":\"hi\\n\"}\n\n");
        assert_eq!(name, Some(StreamEventName::Stdout));
        assert_eq!(
            serde_json::from_str::<OutputEvent>(&data).unwrap().text,
            "hi\n"
        );
        assert_eq!(parse_event(": keep-alive\n\n"), (None, String::new()));
        assert_eq!(encode_path("a b/c%.png"), "a%20b/c%25.png");
    }
}
