//! `/v1/sessions`: open, run in, read, list and close sessions.

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::executions::ExecutionView;
use super::json::ApiJson;
use crate::app::sessions::{Opened, SessionExecutionRequest, SessionRequest};
use crate::app::App;
use crate::audit::sessions::SessionRow;
use crate::role::Role;
use crate::session_wire::{SessionList, SessionView};

/// A session as clients see it (a stored status or reason outside the closed sets never
/// decodes into a row: `audit::unknown_value`).
pub fn view(row: SessionRow) -> Result<SessionView, ApiError> {
    Ok(SessionView {
        id: row.id,
        status: row.status,
        closed_reason: row.closed_reason,
        tenant: row.tenant,
        language: row.language,
        decision: row.decision.0,
        limits: row.limits.0,
        idle_timeout_s: row.idle_timeout_s,
        ttl_s: row.ttl_s,
        executions: row.executions,
        container: row.container,
        created_at: row.created_at,
        last_used_at: row.last_used_at,
        expires_at: row.expires_at,
        closed_at: row.closed_at,
        approval_id: row.approval_id.map(String::from),
        start: row.start.map(|start| start.0),
    })
}

#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    operation_id = "sessions_create",
    summary = "Open a session (a policy decision of its own).",
    security(("bearer" = ["agent"])),
    request_body = api_types::SessionRequest,
    responses(
        (status = 201, description = "the session, `ready`", body = SessionView),
        (status = 202, description = "held for review: `pending_approval`, with `approval_id`", body = SessionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<Response, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiJson(request) = ApiJson::<SessionRequest>::from_request(body, &app).await?;
    match app.create_session(&caller.0, request).await? {
        Opened::Ready(row) => Ok((StatusCode::CREATED, Json(view(row)?)).into_response()),
        Opened::PendingApproval(row) => {
            Ok((StatusCode::ACCEPTED, Json(view(row)?)).into_response())
        }
        Opened::Denied(decision) => {
            let mut denied =
                ApiError::new(ErrorCode::PolicyDenied, "the policy denied this session");
            denied.reasons = Some(decision.reasons);
            Err(denied)
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/executions",
    tag = "sessions",
    operation_id = "sessions_execute",
    summary = "Run code in the session: decided, recorded, answered when it ended.",
    security(("bearer" = ["agent"])),
    params(
        ("id" = String, Path),
    ),
    request_body = api_types::SessionExecutionRequest,
    responses(
        (status = 200, description = "the execution record, with `session_id` and `result`", body = ExecutionView),
        (status = 202, description = "`wait: false`: the record as the turn started; follow its events", body = ExecutionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn execute(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Response, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiJson(request) = ApiJson::<SessionExecutionRequest>::from_request(body, &app).await?;
    let row = app
        .create_session_execution(&caller.0, &id, request)
        .await?;
    if !row.allow {
        return Err(ApiError::policy_denied(row.id, row.reasons.0));
    }
    let status = if row.is(crate::status::ExecutionStatus::Running) {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(ExecutionView::from(row))).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    operation_id = "sessions_get",
    summary = "One session.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the session", body = SessionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(view(app.get_session(&caller.0, &id).await?)?))
}

#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    operation_id = "sessions_list",
    summary = "Sessions, newest first (an agent sees its tenant's).",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    responses(
        (status = 200, description = "sessions, newest first", body = SessionList),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<Json<SessionList>, ApiError> {
    let rows = app.list_sessions(&caller.0).await?;
    let sessions = rows.into_iter().map(view).collect::<Result<_, _>>()?;
    Ok(Json(SessionList { sessions }))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    operation_id = "sessions_delete",
    summary = "Close the session; its sandbox is removed.",
    security(("bearer" = ["agent", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the closed session", body = SessionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn delete(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    caller.require_role(&[Role::Agent, Role::Admin])?;
    Ok(Json(view(app.delete_session(&caller.0, &id).await?)?))
}
