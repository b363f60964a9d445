//! `POST /mcp`: MCP's streamable HTTP transport (agent key). One JSON-RPC message per POST,
//! answered as `application/json`; notifications and responses get 202 with no body. There is
//! no server-initiated stream (`GET /mcp` is 405) and no session: every call stands alone.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

mod local;

use super::auth::Caller;
use super::error::ApiError;
use crate::app::App;
use crate::mcp::protocol;
use crate::role::Role;
use local::Local;

#[utoipa::path(
    post,
    path = "/mcp",
    tag = "mcp",
    operation_id = "mcp_serve",
    summary = "MCP (streamable HTTP): the run_code tool, decided and audited like POST /v1/executions.",
    security(("bearer" = ["agent"])),
    request_body(content = serde_json::Value, description = "one JSON-RPC 2.0 message", content_type = "application/json"),
    responses(
        (status = 200, description = "the JSON-RPC answer", body = serde_json::Value),
        (status = 202, description = "a notification or response was accepted"),
        crate::api::openapi::ApiErrors,
    ),
)]
pub async fn serve(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let runner = Local {
        app,
        caller: caller.0,
    };
    Ok(match protocol::handle_bytes(&runner, &body).await {
        Some(answer) => (
            StatusCode::OK,
            [(CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response(),
        None => StatusCode::ACCEPTED.into_response(),
    })
}
