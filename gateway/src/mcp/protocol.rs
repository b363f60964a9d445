//! JSON-RPC 2.0 as MCP uses it: one message in, at most one out. Requests get a result or an
//! error; notifications and responses get nothing. A malformed message is answered with a
//! JSON-RPC error, never a crash.

use serde_json::{json, Value};

use super::{tools, Runner};

/// Protocol revisions this server speaks, newest first; an unknown one gets the newest.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

/// JSON-RPC error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
}

/// The answer to one raw message (`None`: nothing to send back).
pub async fn handle_bytes<R: Runner>(runner: &R, bytes: &[u8]) -> Option<Value> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(message) => handle(runner, message).await,
        Err(err) => Some(error_response(
            Value::Null,
            &RpcError::new(PARSE_ERROR, format!("not JSON: {err}")),
        )),
    }
}

/// The answer to one parsed message (`None` for notifications and responses).
pub async fn handle<R: Runner>(runner: &R, message: Value) -> Option<Value> {
    let Some(object) = message.as_object() else {
        return Some(error_response(
            Value::Null,
            &RpcError::new(
                INVALID_REQUEST,
                "a JSON-RPC message is an object (batches are not supported)",
            ),
        ));
    };
    let id = object.get("id").cloned();
    let method = object.get("method").and_then(Value::as_str);
    let (Some(id), Some(method)) = (id, method) else {
        // A notification (no id) or a response to us (no method): nothing to answer.
        if object.contains_key("method")
            || object.contains_key("result")
            || object.contains_key("error")
        {
            return None;
        }
        return Some(error_response(
            Value::Null,
            &RpcError::new(INVALID_REQUEST, "neither a request nor a notification"),
        ));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error_response(
            id,
            &RpcError::new(INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\""),
        ));
    }
    let params = object.get("params").cloned().unwrap_or(Value::Null);
    let answer = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": tools::list() })),
        "tools/call" => tools::call(runner, &params).await,
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("method {other:?} is not served (tools only)"),
        )),
    };
    Some(match answer {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => error_response(id, &error),
    })
}

fn initialize(params: &Value) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let version = PROTOCOL_VERSIONS
        .into_iter()
        .find(|known| *known == asked)
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "sandgate", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "run_code runs code in a gVisor sandbox after sandgate's policy allows it; \
                         every call is audited.",
    })
}

pub fn error_response(id: Value, error: &RpcError) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": error.code, "message": error.message},
    })
}
