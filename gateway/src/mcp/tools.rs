//! The tools: `run_code` here, the session tools in [`super::session_tools`]. Arguments are
//! checked here (a malformed call is a JSON-RPC
//! `invalid params` error); what may run is decided by the gateway's policy (a denial is a tool
//! result with `isError` and the policy's reasons, as the MCP spec wants for tool failures).

use api_types::{
    ExecutionRequest, ExecutionStatus, ExecutionView, FileUpload, HostPort, OutputFile,
    RequestedLimits,
};
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::protocol::{RpcError, INVALID_PARAMS};
use super::{Refusal, Runner};

/// Output files returned as image content, at most, and the largest one.
const MAX_IMAGES: usize = 4;
const MAX_IMAGE_BYTES: u64 = 2 * 1024 * 1024;
const ARGUMENTS: [&str; 5] = ["code", "language", "files", "network", "timeout_ms"];

/// `tools/list`.
pub fn list() -> Value {
    let mut tools = vec![run_code_tool()];
    tools.extend(super::session_tools::list());
    tools.push(super::access_tool::tool());
    Value::Array(tools)
}

fn run_code_tool() -> Value {
    json!({
        "name": "run_code",
        "title": "Run code in a sandbox",
        "description": "Runs a program in a fresh gVisor sandbox, if sandgate's policy allows it, \
                        and returns its status, exit code, stdout and stderr, and the files it \
                        wrote to /output (images as image content). Files are placed in \
                        /workspace, the working directory. The network is off unless requested \
                        and granted.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "the program"},
                "language": {"type": "string", "description": "python (default) or bash"},
                "files": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "file name in /workspace -> text content",
                },
                "network": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"host": {"type": "string"}, "port": {"type": "integer"}},
                        "required": ["host", "port"],
                    },
                    "description": "destinations to reach through sandgate's egress proxy",
                },
                "timeout_ms": {"type": "integer", "minimum": 1},
            },
            "required": ["code"],
            "additionalProperties": false,
        },
    })
}

/// `tools/call`: the result, or a JSON-RPC error for a malformed call.
pub async fn call<R: Runner>(runner: &R, params: &Value) -> Result<Value, RpcError> {
    let name = params["name"]
        .as_str()
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "tools/call needs a \"name\""))?;
    let empty = Map::new();
    let arguments = match &params["arguments"] {
        Value::Null => &empty,
        Value::Object(arguments) => arguments,
        _ => {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "\"arguments\" must be an object",
            ))
        }
    };
    if name == super::access_tool::NAME {
        return super::access_tool::call(runner, arguments).await;
    }
    if super::session_tools::NAMES.contains(&name) {
        return super::session_tools::call(runner, name, arguments).await;
    }
    if name != "run_code" {
        return Err(RpcError::new(
            INVALID_PARAMS,
            format!(
                "unknown tool {name:?}: the tools are run_code, {} and {}",
                super::session_tools::NAMES.join(", "),
                super::access_tool::NAME
            ),
        ));
    }
    let body = execution_body(arguments)?;
    Ok(match runner.run(body).await {
        Ok(record) => success(runner, &record).await,
        Err(refusal) => refused(&refusal),
    })
}

/// The `POST /v1/executions` body for `run_code`'s arguments.
fn execution_body(arguments: &Map<String, Value>) -> Result<ExecutionRequest, RpcError> {
    only(arguments, "run_code", &ARGUMENTS)?;
    let code = required_text(arguments, "code")?;
    let language = language(arguments)?;
    Ok(ExecutionRequest {
        files: files(arguments)?,
        network: network(arguments)?,
        limits: RequestedLimits {
            timeout_ms: positive(arguments, "timeout_ms")?,
            ..RequestedLimits::default()
        },
        ..ExecutionRequest::new(language, code)
    })
}

/// `files` (name -> text) as API uploads.
pub(super) fn files(arguments: &Map<String, Value>) -> Result<Vec<FileUpload>, RpcError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut files = Vec::new();
    match arguments.get("files") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (path, content) in map {
                let text = content.as_str().ok_or_else(|| {
                    RpcError::new(
                        INVALID_PARAMS,
                        format!("file {path:?}: content must be a string"),
                    )
                })?;
                files.push(FileUpload {
                    path: path.clone(),
                    content_b64: b64.encode(text),
                });
            }
        }
        Some(_) => {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "\"files\" must map names to text",
            ))
        }
    }
    Ok(files)
}

/// `network`: a list of `{host, port}`.
pub(super) fn network(arguments: &Map<String, Value>) -> Result<Vec<HostPort>, RpcError> {
    match arguments.get("network") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(destination).collect(),
        Some(_) => Err(RpcError::new(
            INVALID_PARAMS,
            "\"network\" must be a list of {host, port}",
        )),
    }
}

/// An optional positive integer argument.
pub(super) fn positive(
    arguments: &Map<String, Value>,
    name: &str,
) -> Result<Option<u64>, RpcError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| {
            RpcError::new(
                INVALID_PARAMS,
                format!("\"{name}\" must be a positive integer"),
            )
        }),
    }
}

/// A required string argument.
pub(super) fn required_text<'a>(
    arguments: &'a Map<String, Value>,
    name: &str,
) -> Result<&'a str, RpcError> {
    arguments
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("\"{name}\" (a string) is required")))
}

/// Refuses arguments a tool does not take.
pub(super) fn only(
    arguments: &Map<String, Value>,
    tool: &str,
    known: &[&str],
) -> Result<(), RpcError> {
    match arguments.keys().find(|key| !known.contains(&key.as_str())) {
        Some(unknown) => Err(RpcError::new(
            INVALID_PARAMS,
            format!("unknown argument {unknown:?}; {tool} takes {known:?}"),
        )),
        None => Ok(()),
    }
}

/// `language`, python when absent.
pub(super) fn language(arguments: &Map<String, Value>) -> Result<&str, RpcError> {
    match arguments.get("language") {
        None | Some(Value::Null) => Ok("python"),
        Some(Value::String(language)) => Ok(language.as_str()),
        Some(_) => Err(RpcError::new(
            INVALID_PARAMS,
            "\"language\" must be a string",
        )),
    }
}

fn destination(item: &Value) -> Result<HostPort, RpcError> {
    match serde_json::from_value::<HostPort>(item.clone()) {
        Ok(destination) => Ok(destination),
        Err(_) => Err(RpcError::new(
            INVALID_PARAMS,
            format!("network destination {item}: want {{\"host\": string, \"port\": 1-65535}}"),
        )),
    }
}

/// A record (any final status, or `pending_approval`): text, images, and the fields as
/// structured content. Only an execution that did not end well is `isError`.
pub(super) async fn success<R: Runner>(runner: &R, record: &ExecutionView) -> Value {
    let status = record.status;
    let mut text = format!("status: {status}\n");
    if let Some(code) = record.exit_code {
        text.push_str(&format!("exit_code: {code}\n"));
    }
    if let Some(approval) = &record.approval_id {
        text.push_str(&format!(
            "sent to a human reviewer (approval {approval}); nothing has run yet\n"
        ));
    }
    for (stream, captured) in [("stdout", &record.stdout), ("stderr", &record.stderr)] {
        if !captured.is_empty() {
            text.push_str(&format!("--- {stream} ---\n{captured}"));
            if !captured.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if let Some(result) = &record.result {
        text.push_str(&format!("result: {result}\n"));
    }
    for output in &record.outputs {
        text.push_str(&format!(
            "output: /output/{} ({} bytes)\n",
            output.path, output.bytes
        ));
    }
    let mut content = vec![json!({"type": "text", "text": text})];
    content.extend(images(runner, &record.id, &record.outputs).await);
    json!({
        "content": content,
        "structuredContent": {
            "id": record.id, "status": status, "exit_code": record.exit_code,
            "stdout": record.stdout, "stderr": record.stderr, "outputs": record.outputs,
            "approval_id": record.approval_id,
            "session_id": record.session_id,
            "result": record.result,
        },
        "isError": !matches!(status, ExecutionStatus::Succeeded | ExecutionStatus::PendingApproval),
    })
}

async fn images<R: Runner>(runner: &R, id: &str, outputs: &[OutputFile]) -> Vec<Value> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut images = Vec::new();
    for output in outputs {
        let path = output.path.as_str();
        let Some(mime) = image_type(path) else {
            continue;
        };
        if output.bytes > MAX_IMAGE_BYTES || images.len() == MAX_IMAGES {
            continue;
        }
        match runner.download(id, path).await {
            Ok(bytes) => {
                images.push(json!({"type": "image", "data": b64.encode(bytes), "mimeType": mime}))
            }
            Err(refusal) => {
                tracing::warn!(execution_id = id, path, error = %refusal.message, "output image not fetched")
            }
        }
    }
    images
}

fn image_type(path: &str) -> Option<&'static str> {
    let extension = path.rsplit_once('.')?.1.to_ascii_lowercase();
    match extension.as_str() {
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        _ => None,
    }
}

/// A refusal (policy denial, bad request, unavailable) as a tool error with the reasons.
pub(super) fn refused(refusal: &Refusal) -> Value {
    let mut text = format!("{}: {}\n", refusal.code, refusal.message);
    for reason in &refusal.reasons {
        text.push_str(&format!("- {}: {}\n", reason.code, reason.message));
    }
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"error": {
            "code": refusal.code, "message": refusal.message,
            "reasons": refusal.reasons, "execution_id": refusal.execution_id,
        }},
        "isError": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_become_an_api_body() {
        let arguments = json!({
            "code": "print(1)", "files": {"a.txt": "hi"},
            "network": [{"host": "pypi.org", "port": 443}], "timeout_ms": 5000,
        });
        let body = execution_body(arguments.as_object().unwrap()).unwrap();
        let body = serde_json::to_value(body).unwrap();
        assert_eq!(body["language"], "python");
        assert_eq!(
            body["files"][0],
            json!({"path": "a.txt", "content_b64": "aGk="})
        );
        assert_eq!(body["network"][0]["port"], 443);
        assert_eq!(body["limits"]["timeout_ms"], 5000);
        assert_eq!(body["wait"], true);
    }

    #[test]
    fn malformed_arguments_are_invalid_params() {
        for arguments in [
            json!({}),
            json!({"code": 1}),
            json!({"code": "x", "shell": true}),
            json!({"code": "x", "network": [{"host": "a", "port": 70000}]}),
            json!({"code": "x", "files": {"a": 1}}),
            json!({"code": "x", "timeout_ms": -1}),
        ] {
            let err = execution_body(arguments.as_object().unwrap()).unwrap_err();
            assert_eq!(err.code, INVALID_PARAMS, "{arguments}");
        }
    }
}
