//! `sandgate exec`: a small client for humans. It creates an execution (`wait: false`), prints
//! its stdout and stderr as they arrive through `GET /v1/executions/{id}/events`, optionally
//! downloads its output files (only as new regular files: `save`), and exits with the
//! program's exit code. `http://` or `https://` (reqwest with rustls; `ca_file` adds a private
//! CA to the system roots).

mod cells;
pub mod repl;
pub mod save;
pub mod sessions;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine as _;
use reqwest::{Method, Response, StatusCode};
use serde_json::{json, Value};

use crate::session_wire::{RunInSession, TurnLimits, Upload};

/// Exit codes for endings that carry no program exit code.
const EXIT_TIMEOUT: i32 = 124;
const EXIT_KILLED: i32 = 137;
const EXIT_CANCELLED: i32 = 130;
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

/// An error with its causes, one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// Runs one execution; returns the exit code `sandgate exec` should exit with.
pub async fn exec(
    request: &ExecRequest,
    stdout: &mut (dyn Write + Send),
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let base = check_url(&request.url)?;
    let client = http_client(&request.tls)?;
    if let Some(session) = &request.session {
        return exec_in_session(&client, request, base, session, stdout, stderr).await;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut body = json!({
        "language": request.language,
        "code": request.code,
        "files": request.files.iter().map(|(path, content)| {
            json!({"path": path, "content_b64": b64.encode(content)})
        }).collect::<Vec<_>>(),
        "network": request.network.iter().map(|(host, port)| json!({"host": host, "port": port})).collect::<Vec<_>>(),
        "mounts": request.mounts,
        "wait": false,
    });
    if let Some(timeout_ms) = request.timeout_ms {
        body["limits"] = json!({ "timeout_ms": timeout_ms });
    }
    let (status, created) = call(
        &client,
        &request.key,
        Method::POST,
        &format!("{base}/v1/executions"),
        Some(&body),
    )
    .await?;
    if status == StatusCode::FORBIDDEN && created["error"]["code"] == "policy_denied" {
        writeln!(stderr, "sandgate: denied by policy")?;
        for reason in created["error"]["reasons"].as_array().into_iter().flatten() {
            writeln!(
                stderr,
                "  {}: {}",
                reason["code"].as_str().unwrap_or("?"),
                reason["message"].as_str().unwrap_or("")
            )?;
        }
        return Ok(EXIT_DENIED);
    }
    if !status.is_success() {
        bail!("{}", api_error(status, &created));
    }
    let id = created["id"]
        .as_str()
        .context("the gateway's answer has no execution id")?
        .to_owned();
    writeln!(stderr, "sandgate: execution {id}")?;
    if created["status"] == "pending_approval" {
        writeln!(
            stderr,
            "sandgate: {id} waits for human review (approval {})",
            created["approval_id"].as_str().unwrap_or("?")
        )?;
        loop {
            tokio::time::sleep(APPROVAL_POLL).await;
            let (status, record) = call(
                &client,
                &request.key,
                Method::GET,
                &format!("{base}/v1/executions/{id}"),
                None,
            )
            .await?;
            if !status.is_success() {
                bail!("{}", api_error(status, &record));
            }
            if record["status"] != "pending_approval" {
                break;
            }
        }
    }

    let summary = follow(&client, request, base, &id, stdout, stderr).await?;
    if let Some(dir) = &request.output_dir {
        download_outputs(&client, request, base, &id, dir, stderr).await?;
    }
    if summary["stdout_truncated"] == true || summary["stderr_truncated"] == true {
        writeln!(
            stderr,
            "sandgate: output was truncated at the execution's output limit"
        )?;
    }
    exit_code_for(&summary, &id, stderr)
}

/// The exit code `sandgate exec` ends with, from how the execution ended.
fn exit_code_for(
    summary: &Value,
    id: &str,
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let ended = summary["status"].as_str().unwrap_or("error");
    Ok(match ended {
        "succeeded" | "failed" => summary["exit_code"]
            .as_i64()
            .and_then(|code| i32::try_from(code).ok())
            .unwrap_or(EXIT_ERROR),
        other => {
            writeln!(stderr, "sandgate: execution {id} ended: {other}")?;
            match other {
                "timeout" => EXIT_TIMEOUT,
                "oom" | "killed" => EXIT_KILLED,
                "cancelled" => EXIT_CANCELLED,
                "denied" => EXIT_DENIED,
                _ => EXIT_ERROR,
            }
        }
    })
}

/// `sandgate exec --session ID`: one execution in an open session, answered when it ended;
/// prints its output, then (python) the final expression's `repr` on stdout.
async fn exec_in_session(
    client: &HttpClient,
    request: &ExecRequest,
    base: &str,
    session: &str,
    stdout: &mut (dyn Write + Send),
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = RunInSession {
        code: request.code.clone(),
        files: request
            .files
            .iter()
            .map(|(path, content)| Upload {
                path: path.clone(),
                content_b64: b64.encode(content),
            })
            .collect(),
        limits: request.timeout_ms.map(|timeout_ms| TurnLimits {
            timeout_ms: Some(timeout_ms),
        }),
    };
    let sessions = sessions::SessionClient::new(client.clone(), base, &request.key);
    let run = match sessions.run(session, &body).await {
        Ok(run) => run,
        Err(sessions::CallError::Api { code, reasons, .. }) if code == "policy_denied" => {
            writeln!(stderr, "sandgate: denied by policy")?;
            for (code, message) in reasons {
                writeln!(stderr, "  {code}: {message}")?;
            }
            return Ok(EXIT_DENIED);
        }
        Err(err) => return Err(err.into()),
    };
    stdout.write_all(run.stdout.as_bytes())?;
    stderr.write_all(run.stderr.as_bytes())?;
    if let Some(result) = &run.result {
        writeln!(stdout, "{result}")?;
    }
    stdout.flush()?;
    if let Some(dir) = &request.output_dir {
        download_outputs(client, request, base, &run.id, dir, stderr).await?;
    }
    let summary = json!({"status": run.status, "exit_code": run.exit_code});
    exit_code_for(&summary, &run.id, stderr)
}

/// Prints the event stream as it arrives; returns the `exit` event's data.
async fn follow(
    client: &HttpClient,
    request: &ExecRequest,
    base: &str,
    id: &str,
    stdout: &mut (dyn Write + Send),
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<Value> {
    let response = send(
        client,
        &request.key,
        Method::GET,
        &format!("{base}/v1/executions/{id}/events"),
        None,
    )
    .await?;
    let status = response.status();
    let mut response = response;
    if !status.is_success() {
        let value = response.json().await.unwrap_or(Value::Null);
        bail!("{}", api_error(status, &value));
    }
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(data) = response.chunk().await.context("reading the event stream")? {
        buffer.extend_from_slice(&data);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..end + 2).collect();
            let (name, data) = parse_event(&String::from_utf8_lossy(&block));
            let Some(data) = data else { continue };
            match name.as_str() {
                "stdout" => {
                    stdout.write_all(data["text"].as_str().unwrap_or("").as_bytes())?;
                    stdout.flush()?;
                }
                "stderr" => {
                    stderr.write_all(data["text"].as_str().unwrap_or("").as_bytes())?;
                    stderr.flush()?;
                }
                "exit" => return Ok(data),
                _ => {}
            }
        }
    }
    bail!("the event stream of {id} ended without an exit event")
}

fn parse_event(block: &str) -> (String, Option<Value>) {
    let mut name = String::from("message");
    let mut data = String::new();
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            name = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    (name, serde_json::from_str(&data).ok())
}

async fn download_outputs(
    client: &HttpClient,
    request: &ExecRequest,
    base: &str,
    id: &str,
    dir: &Path,
    stderr: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let (status, record) = call(
        client,
        &request.key,
        Method::GET,
        &format!("{base}/v1/executions/{id}"),
        None,
    )
    .await?;
    if !status.is_success() {
        bail!("{}", api_error(status, &record));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for output in record["outputs"].as_array().into_iter().flatten() {
        let path = output["path"].as_str().unwrap_or_default();
        // Checked before anything is fetched: the manifest comes from a sandbox.
        if let Err(why) = save::check_name(path, request.save) {
            writeln!(stderr, "sandgate: not written: {path:?}: {why}")?;
            continue;
        }
        let url = format!("{base}/v1/executions/{id}/outputs/{}", encode_path(path));
        let response = send(client, &request.key, Method::GET, &url, None).await?;
        if !response.status().is_success() {
            writeln!(
                stderr,
                "sandgate: could not download {path}: HTTP {}",
                response.status()
            )?;
            continue;
        }
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
    for skipped in record["outputs_skipped"].as_array().into_iter().flatten() {
        writeln!(
            stderr,
            "sandgate: not collected: {} ({})",
            skipped["path"].as_str().unwrap_or("?"),
            skipped["reason"].as_str().unwrap_or("?")
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

async fn send(
    client: &HttpClient,
    key: &str,
    method: Method,
    url: &str,
    body: Option<&Value>,
) -> anyhow::Result<Response> {
    let mut request = client.request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(body);
    }
    request
        .send()
        .await
        .with_context(|| format!("cannot reach the gateway at {url}"))
}

async fn call(
    client: &HttpClient,
    key: &str,
    method: Method,
    url: &str,
    body: Option<&Value>,
) -> anyhow::Result<(StatusCode, Value)> {
    let response = send(client, key, method, url, body).await?;
    let status = response.status();
    let bytes = response.bytes().await.context("reading the answer")?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

fn api_error(status: StatusCode, body: &Value) -> String {
    let hint = if status == StatusCode::UNAUTHORIZED {
        "; the key comes from --key or SANDGATE_KEY"
    } else {
        ""
    };
    format!(
        "the gateway answered {status}: {} ({}){hint}",
        body["error"]["message"].as_str().unwrap_or("no message"),
        body["error"]["code"].as_str().unwrap_or("no code")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_paths_encode() {
        let (name, data) = parse_event("event: stdout\ndata: {\"text\":\"hi\\n\"}\n\n");
        assert_eq!(name, "stdout");
        assert_eq!(data.unwrap()["text"], "hi\n");
        assert_eq!(parse_event(": keep-alive\n\n").1, None);
        assert_eq!(encode_path("a b/c%.png"), "a%20b/c%25.png");
    }
}
