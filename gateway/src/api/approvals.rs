//! `/v1/approvals`: reviewers list and decide executions and sessions held for human review;
//! and the
//! execution listing the review page shows (`GET /v1/executions?limit=&status=`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::FromRequest;
use axum::extract::{Path, Query, State};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use policy_engine::Reason;

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::executions::ExecutionView;
use super::json::ApiJson;
use super::listing::{non_empty, DEFAULT_LIMIT, MAX_LIMIT};
use super::query::page_size;
use crate::app::approvals::{Review, Subject};
use crate::app::App;
use crate::audit::approvals::ApprovalRow;
use crate::role::Role;

/// Roles that may read approvals.
const READERS: &[Role] = &[Role::Reviewer, Role::Auditor, Role::Admin];
/// Roles that may decide them.
const DECIDERS: &[Role] = &[Role::Reviewer, Role::Admin];

/// An approval as clients see it.
#[derive(Debug, Serialize)]
pub struct ApprovalView {
    pub id: String,
    /// What is held: `execution` or `session`.
    pub subject: SubjectKind,
    /// The execution held (`null` for a session's approval).
    pub execution_id: Option<String>,
    /// The session held (absent for an execution's approval).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub status: String,
    pub tenant: Option<String>,
    pub requested_by: Party,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    /// Who approved or rejected it (absent while pending and when it expired).
    pub reviewer: Option<Party>,
    pub comment: Option<String>,
    /// Why the policy sent it to review.
    pub reasons: Vec<Reason>,
    /// What runs once approved: backend, runtime, image, limits, mounts, network grant.
    pub decision: Option<Value>,
    /// What was asked (the policy input's request: language, code sha256, files, network...;
    /// for a session also its `idle_timeout_s` and `ttl_s`).
    pub request: Option<Value>,
    /// The start of the program text, while pending.
    pub code_preview: Option<String>,
}

/// What an approval holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectKind {
    Execution,
    Session,
}

#[derive(Debug, Serialize)]
pub struct Party {
    pub key_id: Option<String>,
    pub principal: Option<String>,
}

impl From<ApprovalRow> for ApprovalView {
    fn from(row: ApprovalRow) -> ApprovalView {
        let reviewer = match row.reviewer_key_id {
            Some(key_id) => Some(Party {
                key_id: Some(key_id),
                principal: row.reviewer_principal,
            }),
            None => None,
        };
        ApprovalView {
            id: row.id,
            subject: if row.session_id.is_some() {
                SubjectKind::Session
            } else {
                SubjectKind::Execution
            },
            execution_id: row.execution_id,
            session_id: row.session_id,
            status: row.status,
            tenant: row.tenant,
            requested_by: Party {
                key_id: row.requester_key_id,
                principal: row.requester_principal,
            },
            created_at: row.created_at,
            expires_at: row.expires_at,
            decided_at: row.decided_at,
            reviewer,
            comment: row.comment,
            reasons: row.reasons.0,
            decision: row.runnable.map(|r| r.0),
            request: row.summary.map(|s| s.0),
            code_preview: row.code_preview,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalQuery {
    /// pending, approved, rejected or expired; absent: all.
    pub status: Option<String>,
    /// Page size (default 50, at most 500).
    pub limit: Option<u32>,
    /// The id of the last approval of the previous page.
    pub before: Option<String>,
}

/// `GET /v1/approvals?status=&limit=&before=`: newest first, a page at a time; `next_before`
/// (absent on the last page) is the cursor for the next, older page.
#[utoipa::path(
    get,
    path = "/v1/approvals",
    tag = "approvals",
    operation_id = "approvals_list",
    summary = "Approvals, e.g. `?status=pending`.",
    security(("bearer" = ["reviewer", "auditor", "admin"])),
    params(
        ("status" = Option<String>, Query),
        ("limit" = Option<u32>, Query),
        ("before" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "`{\"approvals\": [...]}`", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: Result<Query<ApprovalQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(READERS)?;
    let Query(query) = query.map_err(bad_query)?;
    let limit = page_size(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let status = non_empty(query.status);
    let before = non_empty(query.before);
    let rows = app
        .list_approvals(status.as_deref(), before.as_deref(), limit)
        .await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|row| row.id.clone()))
        .flatten();
    let approvals: Vec<ApprovalView> = rows.into_iter().map(ApprovalView::from).collect();
    let mut page = serde_json::json!({ "approvals": approvals });
    if let Some(next) = next_before {
        page["next_before"] = serde_json::json!(next);
    }
    Ok(Json(page))
}

#[utoipa::path(
    get,
    path = "/v1/approvals/{id}",
    tag = "approvals",
    operation_id = "approvals_get",
    summary = "One approval.",
    security(("bearer" = ["reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the approval", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    caller.require_role(READERS)?;
    Ok(Json(app.get_approval(&id).await?.into()))
}

/// Approve or reject: `{"decision":"approve"|"reject","comment":"..."}`. Answers the approval
/// and the execution (`queued` once approved; it then runs in the background), or for a
/// session's approval the session (`ready` once approved and started, `closed` when rejected).
#[utoipa::path(
    post,
    path = "/v1/approvals/{id}",
    tag = "approvals",
    operation_id = "approvals_decide",
    summary = "Approve or reject (never the requesting principal).",
    security(("bearer" = ["reviewer", "admin"])),
    params(
        ("id" = String, Path),
    ),
    request_body = serde_json::Value,
    responses(
        (status = 200, description = "the approval and its execution (or session)", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn decide(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(DECIDERS)?;
    // The body is read only for a caller who may call the route.
    let ApiJson(review) = ApiJson::<Review>::from_request(body, &app).await?;
    let (approval, subject) = app.decide_approval(&caller.0, &id, review).await?;
    let approval = ApprovalView::from(approval);
    Ok(Json(match subject {
        Subject::Execution(execution) => serde_json::json!({
            "approval": approval,
            "execution": ExecutionView::from(*execution),
        }),
        Subject::Session(session) => serde_json::json!({
            "approval": approval,
            "session": super::sessions::view(*session)?,
        }),
    }))
}

fn bad_query(rejection: QueryRejection) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, rejection.body_text())
}
