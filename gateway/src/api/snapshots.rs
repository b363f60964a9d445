//! `POST /v1/sessions/{id}/pause` and `/resume` (DESIGN 15): a paused session is checkpointed
//! to disk and holds no sandbox; resuming restores it with its state. Agents (their own
//! sessions, as for executions in them) and admins.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;

use super::auth::Caller;
use super::error::ApiError;
use super::sessions::view;
use crate::app::App;
use crate::role::Role;
use crate::session_wire::SessionView;

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/pause",
    tag = "sessions",
    operation_id = "sessions_pause",
    summary = "Checkpoint the idle session to disk and release its sandbox (409 while an execution runs).",
    security(("bearer" = ["agent", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the paused session", body = SessionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn pause(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    caller.require_role(&[Role::Agent, Role::Admin])?;
    Ok(Json(view(app.pause_session(&caller.0, &id).await?)?))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/resume",
    tag = "sessions",
    operation_id = "sessions_resume",
    summary = "Restore a paused session with its state (a running one is answered as it is).",
    security(("bearer" = ["agent", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the ready session", body = SessionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn resume(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    caller.require_role(&[Role::Agent, Role::Admin])?;
    Ok(Json(view(app.resume_session(&caller.0, &id).await?)?))
}
