//! `/v1/executions`: create (decide, audit, run) and read back.

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::auth::Caller;
use super::error::ApiError;
use super::json::ApiJson;
use crate::app::executions::{Created, ExecutionRequest};
use crate::app::App;
use crate::audit::ExecutionRow;
use crate::role::Role;
use crate::status::ExecutionStatus;

pub use api_types::{DecisionView, ExecutionView};

/// What a client is told about a failure; the detail stays in the audit store and the logs.
fn public_error(status: ExecutionStatus, error: &str) -> &str {
    if error.starts_with("closed by ") && error.ends_with(" lease expired") {
        // Names two replicas and nothing else: the whole text is the public reason.
        return error;
    }
    match status {
        ExecutionStatus::Killed => "the sandbox stopped before its program ended (resource exhaustion in the sandbox kernel, or killed from outside)",
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

/// A JSON column as its wire type; a value that does not fit is logged and shown empty.
fn typed<T: serde::de::DeserializeOwned + Default>(id: &str, column: &str, value: Value) -> T {
    serde_json::from_value(value).unwrap_or_else(|err| {
        tracing::error!(execution_id = %id, column, error = %err, "execution record column unreadable");
        T::default()
    })
}

impl From<ExecutionRow> for ExecutionView {
    fn from(row: ExecutionRow) -> ExecutionView {
        let status = row.status;
        ExecutionView {
            error: row
                .error
                .as_deref()
                .map(|error| public_error(status, error).to_owned()),
            instance: row.instance.clone(),
            decision: DecisionView {
                id: row.decision_id,
                allow: row.allow,
                backend: row.backend,
                reasons: row.reasons.0,
                policy_revision: row.policy_revision,
            },
            labels: typed(&row.id, "labels", row.labels.0),
            outputs: typed(&row.id, "outputs", row.outputs.0),
            outputs_skipped: typed(&row.id, "outputs_skipped", row.outputs_skipped.0),
            id: row.id,
            status,
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
            outputs_truncated: row.outputs_truncated,
            purged_at: row.purged_at,
            created_at: row.created_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            start: row.start.map(|start| start.0),
            container: row.container,
            session_id: row.session_id,
            result: row.result,
            results: row
                .results
                .as_ref()
                .map(|results| results.0.results.clone())
                .unwrap_or_default(),
            results_truncated: row.results.is_some_and(|results| results.0.truncated),
            resumed: row.resumed,
            files: None,
            grant: None,
            approval_id: None,
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
    request_body = api_types::ExecutionRequest,
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
            let view = ExecutionView {
                approval_id: Some(approval_id),
                ..ExecutionView::from(row)
            };
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
        (status = 200, description = "the attempts and the HTTP requests inside inspected tunnels", body = Connections),
        super::openapi::ApiErrors,
    ),
)]
pub async fn connections(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Connections>, ApiError> {
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
    Ok(Json(Connections {
        connections,
        requests,
    }))
}

/// `GET /v1/executions/{id}/connections`. (Fields alphabetical, as the answer always had them.)
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Connections {
    /// Every egress attempt, allowed or refused.
    pub connections: Vec<crate::audit::egress::ConnectionRow>,
    /// The HTTP requests seen inside inspected (TLS-terminated) tunnels.
    pub requests: Vec<crate::audit::review::RequestRow>,
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
