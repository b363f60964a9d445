//! `POST /v1/sessions/{id}/pause` and `/resume` (DESIGN 15): a paused session is checkpointed
//! to disk and holds no sandbox; resuming restores it with its state. Agents (their own
//! sessions, as for executions in them) and admins. And the kept snapshots:
//! `POST /v1/sessions/{id}/snapshots`, `GET /v1/snapshots[/{id}]`, `DELETE /v1/snapshots/{id}`
//! (a tenant's only, 404 across; forks: `POST /v1/sessions {"from_snapshot"}`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::auth::Caller;
use super::error::ApiError;
use super::sessions::view;
use crate::app::App;
use crate::audit::snapshots::SnapshotRow;
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

/// A kept snapshot of a session (never its path on the gateway's disk).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SnapshotView {
    pub id: String,
    pub session_id: String,
    pub bytes: i64,
    pub sha256: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl From<SnapshotRow> for SnapshotView {
    fn from(row: SnapshotRow) -> SnapshotView {
        SnapshotView {
            id: row.id,
            session_id: row.session_id,
            bytes: row.bytes,
            sha256: row.sha256,
            created_at: row.created_at,
            expires_at: row.expires_at,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/snapshots",
    tag = "sessions",
    operation_id = "snapshots_create",
    summary = "Keep a snapshot of the idle session (it goes on); 429 past the tenant's quota.",
    security(("bearer" = ["agent", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 201, description = "the snapshot", body = SnapshotView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<SnapshotView>), ApiError> {
    caller.require_role(&[Role::Agent, Role::Admin])?;
    let row = app.create_snapshot(&caller.0, &id).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots",
    tag = "sessions",
    operation_id = "snapshots_list",
    summary = "Kept snapshots, newest first (an agent sees its tenant's).",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    responses(
        (status = 200, description = "snapshots", body = SnapshotList),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<Json<SnapshotList>, ApiError> {
    let rows = app.list_snapshots(&caller.0).await?;
    let snapshots = rows.into_iter().map(SnapshotView::from).collect();
    Ok(Json(SnapshotList { snapshots }))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots/{id}",
    tag = "sessions",
    operation_id = "snapshots_get",
    summary = "One kept snapshot.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the snapshot", body = SnapshotView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    Ok(Json(app.get_snapshot(&caller.0, &id).await?.into()))
}

#[utoipa::path(
    delete,
    path = "/v1/snapshots/{id}",
    tag = "sessions",
    operation_id = "snapshots_delete",
    summary = "Delete the snapshot: its image is removed.",
    security(("bearer" = ["agent", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the deleted snapshot", body = SnapshotView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn delete(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    caller.require_role(&[Role::Agent, Role::Admin])?;
    Ok(Json(app.delete_snapshot(&caller.0, &id).await?.into()))
}
