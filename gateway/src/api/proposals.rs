//! `/v1/policy/proposals`: policy changes as reviewed proposals (`app/proposals.rs`), and
//! `POST /v1/executions/{id}/access-request`, an agent asking for what it was refused.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::FromRequest;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use super::listing::non_empty;
use super::query::page_size;
use crate::app::proposals::{
    Draft, Origin, Window, MAX_DAYS, MAX_LIST, MAX_PATCH_BYTES, MAX_REPLAY_DECISIONS, MAX_TEXT,
};
use crate::app::App;
use crate::audit::proposals::{ProposalRow, ProposalStatus};
use crate::role::Role;

/// Roles that may read proposals.
const READERS: &[Role] = &[Role::Reviewer, Role::Auditor, Role::Admin];
/// Roles that may open and decide them.
const DECIDERS: &[Role] = &[Role::Reviewer, Role::Admin];

/// `POST /v1/policy/proposals`: a patch, or `from_execution` (the bundle's suggestion).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewProposal {
    title: Option<String>,
    rationale: Option<String>,
    /// `{"data/tenants.yaml": <JSON merge patch>}`; absent with `from_execution`.
    patch: Option<Map<String, Value>>,
    from_execution: Option<String>,
    source_approval: Option<String>,
    /// Replay window in days (default 7, at most 90).
    days: Option<u32>,
    /// Most decisions replayed, the newest of the window (default and at most 20,000).
    replay_limit: Option<usize>,
}

/// `reject` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    comment: Option<String>,
}

/// `approve` body: the candidate revision the reviewer was shown (a rebase changes it).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    candidate_revision: Option<String>,
    comment: Option<String>,
}

/// `rebase` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rebase {
    days: Option<u32>,
    replay_limit: Option<usize>,
}

/// `POST /v1/executions/{id}/access-request` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessRequest {
    /// Why the agent needs it: shown to reviewers as the agent's words.
    justification: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProposalQuery {
    /// open, approved or rejected; absent: all.
    status: Option<String>,
    /// Page size (default 50, at most 200).
    limit: Option<u32>,
    /// The id of the last proposal of the previous page.
    before: Option<String>,
}

fn bounded(field: &str, text: String) -> Result<String, ApiError> {
    if text.len() > MAX_TEXT || text.contains('\0') {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("{field} must be at most {MAX_TEXT} bytes, without NUL"),
        ));
    }
    Ok(text)
}

/// The replay window asked for: `days` (1 to 90, default 7), `replay_limit` (1 to 20,000,
/// the default).
fn window(days: Option<u32>, limit: Option<usize>) -> Result<Window, ApiError> {
    let days = match days.unwrap_or(7) {
        d @ 1..=MAX_DAYS => d,
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("days must be from 1 to {MAX_DAYS}"),
            ))
        }
    };
    let limit = match limit.unwrap_or(MAX_REPLAY_DECISIONS) {
        n @ 1..=MAX_REPLAY_DECISIONS => n,
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("replay_limit must be from 1 to {MAX_REPLAY_DECISIONS}"),
            ))
        }
    };
    Ok(Window { days, limit })
}

fn view(row: ProposalRow) -> Value {
    json!(row)
}

#[utoipa::path(
    post,
    path = "/v1/policy/proposals",
    tag = "policy",
    operation_id = "proposals_create",
    summary = "Propose a change of the bundle's data: `{title, rationale, patch}` (a JSON merge patch per data file) or `{from_execution}` (the bundle's `data.sandgate.suggest`); its tests and a replay are computed now.",
    security(("bearer" = ["reviewer", "admin"])),
    request_body = serde_json::Value,
    responses(
        (status = 201, description = "the proposal with its evidence", body = serde_json::Value),
        (status = 422, description = "no_suggestion: the bundle suggests nothing for that execution", body = super::error::ErrorBody),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<(axum::http::StatusCode, Json<Value>), ApiError> {
    caller.require_role(DECIDERS)?;
    let ApiJson(request) = ApiJson::<NewProposal>::from_request(body, &app).await?;
    let window = window(request.days, request.replay_limit)?;
    let (patch, title, rationale) = match (request.patch, &request.from_execution) {
        (Some(patch), None) => (patch, request.title, request.rationale),
        (None, Some(id)) => {
            let (patch, reasons) = app.suggestion_for(id).await?;
            let codes: Vec<&str> = reasons.iter().map(|r| r.code.as_str()).collect();
            let title = request.title.or_else(|| {
                Some(format!(
                    "Allow what {id} was refused ({})",
                    codes.join(", ")
                ))
            });
            let rationale = request.rationale.or_else(|| {
                Some(format!(
                    "The bundle's suggestion for {id}'s reasons: {}.",
                    codes.join(", ")
                ))
            });
            (patch, title, rationale)
        }
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "give exactly one of patch and from_execution",
            ))
        }
    };
    if json!(patch).to_string().len() > MAX_PATCH_BYTES {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the patch must be at most {MAX_PATCH_BYTES} bytes of JSON"),
        ));
    }
    let title = bounded(
        "title",
        title
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "a proposal needs a title"))?,
    )?;
    let draft = Draft {
        title,
        rationale: bounded("rationale", rationale.unwrap_or_default())?,
        patch,
        source_execution: request.from_execution,
        source_approval: request.source_approval,
        justification: None,
        origin: Origin::Reviewer,
        window,
    };
    let row = app.create_proposal(&caller.0, draft).await?;
    Ok((axum::http::StatusCode::CREATED, Json(view(row))))
}

#[utoipa::path(
    get,
    path = "/v1/policy/proposals",
    tag = "policy",
    operation_id = "proposals_list",
    summary = "Proposals, newest first, a page at a time (`?status=open&limit=&before=`).",
    security(("bearer" = ["reviewer", "auditor", "admin"])),
    params(
        ("status" = Option<String>, Query),
        ("limit" = Option<u32>, Query),
        ("before" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "`{proposals, next_before}`", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: Result<Query<ProposalQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(READERS)?;
    let Query(query) = query
        .map_err(|rejection| ApiError::new(ErrorCode::InvalidRequest, rejection.body_text()))?;
    let limit = page_size(query.limit, 50, MAX_LIST)?;
    let status = match non_empty(query.status) {
        None => None,
        Some(text) => Some(ProposalStatus::parse(&text).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                "status must be open, approved or rejected",
            )
        })?),
    };
    let before = non_empty(query.before);
    let rows = app
        .audit
        .list_proposals(status, before.as_deref(), limit)
        .await
        .map_err(crate::app::AppError::from)?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|row| row.id.clone()))
        .flatten();
    let proposals: Vec<Value> = rows.into_iter().map(summary).collect();
    Ok(Json(
        json!({"proposals": proposals, "next_before": next_before}),
    ))
}

/// A listed proposal: the evidence's counts, not its examples and files.
fn summary(row: ProposalRow) -> Value {
    let mut value = view(row);
    if let Some(evidence) = value.get_mut("evidence").and_then(Value::as_object_mut) {
        evidence.remove("files");
    }
    value
}

#[utoipa::path(
    get,
    path = "/v1/policy/proposals/{id}",
    tag = "policy",
    operation_id = "proposals_get",
    summary = "One proposal: its patch, the patched files, tests and replay impact.",
    security(("bearer" = ["reviewer", "auditor", "admin"])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "the proposal", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(READERS)?;
    Ok(Json(view(app.get_proposal(&id).await?)))
}

#[utoipa::path(
    post,
    path = "/v1/policy/proposals/{id}/approve",
    tag = "policy",
    operation_id = "proposals_approve",
    summary = "Approve and apply `{\"candidate_revision\": ...}`, the candidate you reviewed (409 if it was rebased since), never by its author's principal; only while its base is the active revision on every replica, else 409 revision_conflict; not while its tests fail.",
    security(("bearer" = ["reviewer", "admin"])),
    params(("id" = String, Path)),
    request_body = serde_json::Value,
    responses(
        (status = 200, description = "the proposal and the reload it made", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn approve(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(DECIDERS)?;
    let approval: Approval = super::policy::optional_body(body).await?;
    let comment = approval
        .comment
        .map(|c| bounded("comment", c))
        .transpose()?;
    let reviewed = approval
        .candidate_revision
        .filter(|revision| !revision.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                "approve names the candidate_revision you reviewed (GET /v1/policy/proposals/{id})",
            )
        })?;
    let (row, applied) = app
        .approve_proposal(&caller.0, &id, (reviewed, comment))
        .await?;
    Ok(Json(json!({"proposal": view(row), "applied": applied})))
}

#[utoipa::path(
    post,
    path = "/v1/policy/proposals/{id}/reject",
    tag = "policy",
    operation_id = "proposals_reject",
    summary = "Reject with a comment.",
    security(("bearer" = ["reviewer", "admin"])),
    params(("id" = String, Path)),
    request_body = serde_json::Value,
    responses(
        (status = 200, description = "the proposal", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn reject(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(DECIDERS)?;
    let verdict: Verdict = super::policy::optional_body(body).await?;
    let comment = verdict
        .comment
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "a rejection needs a comment"))?;
    let row = app
        .reject_proposal(&caller.0, &id, bounded("comment", comment)?)
        .await?;
    Ok(Json(view(row)))
}

#[utoipa::path(
    post,
    path = "/v1/policy/proposals/{id}/rebase",
    tag = "policy",
    operation_id = "proposals_rebase",
    summary = "Build an open proposal again on the active revision: its tests and replay recomputed.",
    security(("bearer" = ["reviewer", "admin"])),
    params(("id" = String, Path)),
    request_body = serde_json::Value,
    responses(
        (status = 200, description = "the proposal", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn rebase(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(DECIDERS)?;
    let request: Rebase = super::policy::optional_body(body).await?;
    let window = window(request.days, request.replay_limit)?;
    let row = app.rebase_proposal(&caller.0, &id, window).await?;
    Ok(Json(view(row)))
}

#[utoipa::path(
    post,
    path = "/v1/executions/{id}/access-request",
    tag = "executions",
    operation_id = "executions_access_request",
    summary = "Ask for what your denied or held execution was refused: opens a proposal from the bundle's suggestion for a reviewer; it grants nothing by itself.",
    security(("bearer" = ["agent"])),
    params(("id" = String, Path)),
    request_body = serde_json::Value,
    responses(
        (status = 201, description = "the proposal (id, status, patch, evidence)", body = serde_json::Value),
        (status = 422, description = "no_suggestion", body = super::error::ErrorBody),
        super::openapi::ApiErrors,
    ),
)]
pub async fn access_request(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<(axum::http::StatusCode, Json<Value>), ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiJson(request) = ApiJson::<AccessRequest>::from_request(body, &app).await?;
    let justification = bounded("justification", request.justification)?;
    let row = app.request_access(&caller.0, &id, justification).await?;
    Ok((
        axum::http::StatusCode::CREATED,
        Json(json!({
            "proposal_id": row.id,
            "status": row.status,
            "patch": row.patch.0,
            "tests_passed": row.tests_passed,
        })),
    ))
}
