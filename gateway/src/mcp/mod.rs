//! The MCP (Model Context Protocol) server: agent frameworks call sandgate as a tool.
//!
//! One protocol core ([`protocol`]: JSON-RPC 2.0, `initialize`, `tools/list`, `tools/call`)
//! and the tools ([`tools`]: `run_code`; [`session_tools`]: `open_session`, `run_in_session`,
//! `close_session`), served two ways:
//! - `POST /mcp` on the gateway (streamable HTTP, bearer key; `api::mcp`), running through
//!   [`local::Local`], which calls `App::create_execution` under the caller's key;
//! - `sandgate mcp --url --key` over stdio ([`stdio`]), a client of the gateway's HTTP API
//!   ([`remote::Remote`]).
//!
//! Either way every call is decided by the policy and audited by the gateway, exactly as
//! `POST /v1/executions` (or the session routes) are: this module never reaches the runtime or
//! the audit store itself.

pub mod local;
pub mod protocol;
pub mod remote;
pub mod session_tools;
pub mod stdio;
pub mod tools;

use std::future::Future;

use serde_json::Value;

/// Most bytes of one JSON-RPC message the stdio server reads (the HTTP route has the API's
/// body limit).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// Why a tool call did not produce an execution record: the API's error shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The API's error code (`policy_denied`, `invalid_request`, `unavailable`, ...).
    pub code: String,
    pub message: String,
    /// The policy's reasons (`policy_denied`), as the API gives them.
    pub reasons: Vec<Value>,
    pub execution_id: Option<String>,
}

impl Refusal {
    pub fn new(code: &str, message: impl Into<String>) -> Refusal {
        Refusal {
            code: code.to_owned(),
            message: message.into(),
            reasons: Vec::new(),
            execution_id: None,
        }
    }

    /// From the API's `{"error": {...}}` body.
    pub fn from_error_body(status: u16, body: &Value) -> Refusal {
        let error = &body["error"];
        Refusal {
            code: error["code"].as_str().unwrap_or("unavailable").to_owned(),
            message: error["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| format!("the gateway answered HTTP {status}")),
            reasons: error["reasons"].as_array().cloned().unwrap_or_default(),
            execution_id: error["execution_id"].as_str().map(str::to_owned),
        }
    }
}

/// Where tool calls go: the gateway's own use cases, or its HTTP API.
pub trait Runner: Sync {
    /// Creates an execution from a `POST /v1/executions` body (with `wait: true`) and returns
    /// its record as the API shows it.
    fn run(&self, body: Value) -> impl Future<Output = Result<Value, Refusal>> + Send;
    /// The bytes of one output file of an execution.
    fn download(
        &self,
        execution_id: &str,
        path: &str,
    ) -> impl Future<Output = Result<Vec<u8>, Refusal>> + Send;
    /// Opens a session from a `POST /v1/sessions` body; returns the session as the API shows it.
    fn open_session(&self, body: Value) -> impl Future<Output = Result<Value, Refusal>> + Send;
    /// Runs one execution in session `id` (a `POST /v1/sessions/{id}/executions` body); returns
    /// its record as the API shows it.
    fn run_in_session(
        &self,
        id: &str,
        body: Value,
    ) -> impl Future<Output = Result<Value, Refusal>> + Send;
    /// Closes session `id`; returns it as the API shows it.
    fn close_session(&self, id: &str) -> impl Future<Output = Result<Value, Refusal>> + Send;
}
