//! `/v1/executions`: create (decide, audit, run) and read back.

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use policy_engine::{Limits, Reason};

use super::auth::Caller;
use super::error::ApiError;
use super::json::ApiJson;
use crate::app::executions::{Created, ExecutionRequest};
use crate::app::App;
use crate::audit::ExecutionRow;
use crate::role::Role;
use crate::status::ExecutionStatus;

/// An execution as clients see it (DESIGN 4.2).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ExecutionView {
    pub id: String,
    pub status: ExecutionStatus,
    pub tenant: String,
    pub language: String,
    pub exit_code: Option<i32>,
    /// The output as text: exactly what the program wrote when that is UTF-8 (NUL included,
    /// as `\u0000`); otherwise each invalid sequence shows as U+FFFD and the exact bytes are in
    /// `stdout_base64`.
    pub stdout: String,
    pub stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: Option<i64>,
    pub decision: DecisionView,
    pub limits: Option<Limits>,
    pub labels: Value,
    pub outputs: Value,
    /// What was in `/output` but not collected, and why.
    pub outputs_skipped: Value,
    /// The output limit stopped collection.
    pub outputs_truncated: bool,
    /// Set once retention has purged stdout, stderr and the output files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purged_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// `warm` (a pooled sandbox) or `cold`; absent until it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// The container that ran it (`sandgate-...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The session it ran in, and (python) its final expression's `repr` (DESIGN 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Set for status `error`; the detail stays in the gateway's log and audit store (except
    /// a record another replica closed: `closed by <instance>: owner <instance> lease expired`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `GET /v1/executions/{id}` only: the uploaded files, `[{"path","bytes"}]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<Value>,
    /// `GET /v1/executions/{id}` only: what the policy granted, `{"network","mounts"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<Value>,
    /// The replica (gateway instance id) that ran it, or holds it while it waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DecisionView {
    pub id: String,
    pub allow: bool,
    pub backend: Option<String>,
    pub reasons: Vec<Reason>,
    pub policy_revision: String,
}

/// What a client is told about a failure; the detail stays in the audit store and the logs.
fn public_error<'a>(status: &str, error: &'a str) -> &'a str {
    if error.starts_with("closed by ") && error.ends_with(" lease expired") {
        // Names two replicas and nothing else: the whole text is the public reason.
        return error;
    }
    match status {
        "killed" => "the sandbox stopped before its program ended (resource exhaustion in the sandbox kernel, or killed from outside)",
        _ => "the sandbox could not be run",
    }
}

fn as_text(bytes: Option<&[u8]>) -> String {
    String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned()
}

/// The exact bytes (base64) of output that is not valid UTF-8, whose text form lost some.
fn exact_unless_text(bytes: Option<&[u8]>) -> Option<String> {
    use base64::Engine as _;
    let bytes = bytes?;
    std::str::from_utf8(bytes)
        .is_err()
        .then(|| base64::engine::general_purpose::STANDARD.encode(bytes))
}

impl From<ExecutionRow> for ExecutionView {
    fn from(row: ExecutionRow) -> ExecutionView {
        ExecutionView {
            error: row
                .error
                .as_deref()
                .map(|error| public_error(&row.status, error).to_owned()),
            instance: row.instance.clone(),
            decision: DecisionView {
                id: row.decision_id,
                allow: row.allow,
                backend: row.backend,
                reasons: row.reasons.0,
                policy_revision: row.policy_revision,
            },
            id: row.id,
            status: ExecutionStatus::parse(&row.status).unwrap_or_else(|| {
                tracing::error!(status = %row.status, "execution record with an unknown status");
                ExecutionStatus::Error
            }),
            tenant: row.tenant,
            language: row.language,
            exit_code: row.exit_code,
            stdout: as_text(row.stdout.as_deref()),
            stderr: as_text(row.stderr.as_deref()),
            stdout_base64: exact_unless_text(row.stdout.as_deref()),
            stderr_base64: exact_unless_text(row.stderr.as_deref()),
            stdout_truncated: row.stdout_truncated,
            stderr_truncated: row.stderr_truncated,
            duration_ms: row.duration_ms,
            limits: row.limits.map(|limits| limits.0),
            labels: row.labels.0,
            outputs: row.outputs.0,
            outputs_skipped: row.outputs_skipped.0,
            outputs_truncated: row.outputs_truncated,
            purged_at: row.purged_at,
            created_at: row.created_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            start: row.start,
            container: row.container,
            session_id: row.session_id,
            result: row.result,
            files: None,
            grant: None,
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/executions",
    tag = "executions",
    operation_id = "executions_create",
    summary = "Decide, record and run code.",
    security(("bearer" = ["agent"])),
    request_body = crate::app::executions::ExecutionRequest,
    responses(
        (status = 200, description = "finished (any final status)", body = ExecutionView),
        (status = 202, description = "accepted (`wait: false`) or sent to review (`pending_approval`, with `approval_id`)", body = ExecutionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<Response, ApiError> {
    caller.require_role(&[Role::Agent])?;
    // The body is read only for a caller who may call the route.
    let ApiJson(request) = ApiJson::<ExecutionRequest>::from_request(body, &app).await?;
    match app.create_execution(&caller.0, request).await? {
        Created::Finished(row) => {
            Ok((StatusCode::OK, Json(ExecutionView::from(row))).into_response())
        }
        Created::Accepted(row) => {
            Ok((StatusCode::ACCEPTED, Json(ExecutionView::from(row))).into_response())
        }
        Created::Denied(row) => Err(ApiError::policy_denied(row.id, row.reasons.0)),
        Created::PendingApproval { row, approval_id } => {
            let mut view = serde_json::json!(ExecutionView::from(row));
            view["approval_id"] = serde_json::json!(approval_id);
            Ok((StatusCode::ACCEPTED, Json(view)).into_response())
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/executions/{id}/cancel",
    tag = "executions",
    operation_id = "executions_cancel",
    summary = "Stop a running execution; answers the final record.",
    security(("bearer" = ["agent", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the final record", body = ExecutionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn cancel(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ExecutionView>, ApiError> {
    caller.require_role(&[Role::Agent, Role::Admin])?;
    let row = app.cancel_execution(&caller.0, &id).await?;
    Ok(Json(ExecutionView::from(row)))
}

/// Every egress attempt of the execution, allowed or denied, in order.
#[utoipa::path(
    get,
    path = "/v1/executions/{id}/connections",
    tag = "executions",
    operation_id = "executions_connections",
    summary = "Every egress attempt of the execution.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "`{\"connections\": [...], \"requests\": [...]}`: the attempts and the HTTP requests inside inspected tunnels", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn connections(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row = app.get_execution(&caller.0, &id).await?;
    let connections = app
        .audit
        .connections(&row.id)
        .await
        .map_err(|err| ApiError::from(crate::app::AppError::from(err)))?;
    let requests = app
        .audit
        .egress_requests(&row.id)
        .await
        .map_err(|err| ApiError::from(crate::app::AppError::from(err)))?;
    Ok(Json(
        serde_json::json!({ "connections": connections, "requests": requests }),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/executions/{id}",
    tag = "executions",
    operation_id = "executions_get",
    summary = "One execution record.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the record", body = ExecutionView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ExecutionView>, ApiError> {
    let row = app.get_execution(&caller.0, &id).await?;
    let live = (row.finished_at.is_none())
        .then(|| app.streams.get(&row.id))
        .flatten();
    let recorded = app.audit.execution_grant(&row.id).await;
    let mut view = ExecutionView::from(row);
    if let Some((files, grant)) =
        recorded.map_err(|err| ApiError::from(crate::app::AppError::from(err)))?
    {
        view.files = Some(files);
        view.grant = Some(grant);
    }
    // While it runs here: the output so far, as the live stream has it.
    if let Some(stream) = live {
        (view.stdout, view.stderr) = stream.text_so_far();
    }
    Ok(Json(view))
}
