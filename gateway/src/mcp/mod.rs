//! The MCP (Model Context Protocol) server: agent frameworks call sandgate as a tool.
//!
//! One protocol core ([`protocol`]: JSON-RPC 2.0, `initialize`, `tools/list`, `tools/call`)
//! and the tools ([`tools`]: `run_code`; [`session_tools`]: `open_session`, `run_in_session`,
//! `close_session`), served two ways:
//! - `POST /mcp` on the gateway (streamable HTTP, bearer key; `api::mcp`), running through
//!   `api::mcp::local::Local`, which calls `App::create_execution` under the caller's key
//!   (it lives in the API layer, which this module sits below);
//! - `sandgate mcp --url --key` over stdio ([`stdio`]), a client of the gateway's HTTP API
//!   ([`remote::Remote`]).
//!
//! Either way every call is decided by the policy and audited by the gateway, exactly as
//! `POST /v1/executions` (or the session routes) are: this module never reaches the runtime or
//! the audit store itself.

mod access_tool;
pub mod protocol;
pub mod remote;
pub mod session_tools;
pub mod stdio;
pub mod tools;

use std::future::Future;

use api_types::{
    ErrorBody, ErrorCode, ExecutionRequest, ExecutionView, Reason, SessionExecutionRequest,
    SessionRequest, SessionView,
};

/// Most bytes of one JSON-RPC message the stdio server reads (the HTTP route has the API's
/// body limit).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// Why a tool call did not produce an execution record: the API's error shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
    /// The policy's reasons (`policy_denied`).
    pub reasons: Vec<Reason>,
    pub execution_id: Option<String>,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            reasons: Vec::new(),
            execution_id: None,
        }
    }

    /// From the API's `{"error": {...}}` body (anything else: `unavailable`).
    pub fn from_error_body(status: u16, body: &[u8]) -> Refusal {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(ErrorBody { error }) => Refusal {
                code: error.code,
                message: error.message,
                reasons: error.reasons.unwrap_or_default(),
                execution_id: error.execution_id,
            },
            Err(_) => Refusal::new(
                ErrorCode::Unavailable,
                format!("the gateway answered HTTP {status}"),
            ),
        }
    }
}

/// Where tool calls go: the gateway's own use cases, or its HTTP API.
pub trait Runner: Sync {
    /// Creates an execution (`POST /v1/executions`, with `wait: true`) and returns its record.
    fn run(
        &self,
        body: ExecutionRequest,
    ) -> impl Future<Output = Result<ExecutionView, Refusal>> + Send;
    /// The bytes of one output file of an execution.
    fn download(
        &self,
        execution_id: &str,
        path: &str,
    ) -> impl Future<Output = Result<Vec<u8>, Refusal>> + Send;
    /// Opens a session (`POST /v1/sessions`).
    fn open_session(
        &self,
        body: SessionRequest,
    ) -> impl Future<Output = Result<SessionView, Refusal>> + Send;
    /// Runs one execution in session `id` (`POST /v1/sessions/{id}/executions`); returns its
    /// record.
    fn run_in_session(
        &self,
        id: &str,
        body: SessionExecutionRequest,
    ) -> impl Future<Output = Result<ExecutionView, Refusal>> + Send;
    /// Closes session `id`; returns it as the API shows it.
    fn close_session(&self, id: &str) -> impl Future<Output = Result<SessionView, Refusal>> + Send;
    /// Asks for access after execution `id` was refused
    /// (`POST /v1/executions/{id}/access-request`); returns the answer.
    fn request_access(
        &self,
        id: &str,
        justification: &str,
    ) -> impl Future<Output = Result<api_types::AccessRequested, Refusal>> + Send;
}
