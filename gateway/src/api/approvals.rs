//! `/v1/approvals`: reviewers list and decide executions and sessions held for human review.
//! The execution listing the review page shows is `listing.rs`.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::FromRequest;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::executions::ExecutionView;
use super::json::ApiJson;
use super::listing::{non_empty, DEFAULT_LIMIT, MAX_LIMIT};
use super::query::page_size;
use crate::app::approvals::{Review, Reviewed};
use crate::app::App;
use crate::audit::approvals::ApprovalRow;
use crate::role::Role;

/// Roles that may read approvals.
const READERS: &[Role] = &[Role::Reviewer, Role::Auditor, Role::Admin];
/// Roles that may decide them.
const DECIDERS: &[Role] = &[Role::Reviewer, Role::Admin];

pub use api_types::{
    ApprovalPage, ApprovalStatus, ApprovalView, DecidedApproval, Party, SubjectKind,
};

impl From<ApprovalRow> for ApprovalView {
    fn from(row: ApprovalRow) -> ApprovalView {
        let reviewer = match row.reviewer_key_id {
            Some(key_id) => Some(Party {
                key_id: Some(key_id),
                principal: row.reviewer_principal,
            }),
            None => None,
        };
        let status = row.status;
        ApprovalView {
            id: row.id.into(),
            subject: if row.session_id.is_some() {
                SubjectKind::Session
            } else {
                SubjectKind::Execution
            },
            execution_id: row.execution_id,
            session_id: row.session_id,
            status,
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
        (status = 200, description = "a page, newest first", body = ApprovalPage),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: Result<Query<ApprovalQuery>, QueryRejection>,
) -> Result<Json<ApprovalPage>, ApiError> {
    caller.require_role(READERS)?;
    let Query(query) = query.map_err(bad_query)?;
    let limit = page_size(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let status = non_empty(query.status);
    let before = non_empty(query.before);
    let rows = app
        .list_approvals(status.as_deref(), before.as_deref(), limit)
        .await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|row| row.id.to_string()))
        .flatten();
    Ok(Json(ApprovalPage {
        approvals: rows.into_iter().map(ApprovalView::from).collect(),
        next_before,
    }))
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
        (status = 200, description = "the approval", body = ApprovalView),
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
    request_body = crate::app::approvals::Review,
    responses(
        (status = 200, description = "the approval and its execution (or session)", body = DecidedApproval),
        super::openapi::ApiErrors,
    ),
)]
pub async fn decide(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<DecidedApproval>, ApiError> {
    caller.require_role(DECIDERS)?;
    // The body is read only for a caller who may call the route.
    let ApiJson(review) = ApiJson::<Review>::from_request(body, &app).await?;
    let (approval, subject) = app.decide_approval(&caller.0, &id, review).await?;
    let approval = ApprovalView::from(approval);
    Ok(Json(match subject {
        Reviewed::Execution(execution) => DecidedApproval {
            approval,
            execution: Some(ExecutionView::from(*execution)),
            session: None,
        },
        Reviewed::Session(session) => DecidedApproval {
            approval,
            execution: None,
            session: Some(super::sessions::view(*session)?),
        },
    }))
}

fn bad_query(rejection: QueryRejection) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, rejection.body_text())
}
