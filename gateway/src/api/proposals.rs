//! `/v1/policy/proposals`: policy changes as reviewed proposals (`app/proposals.rs`), and
//! `POST /v1/executions/{id}/access-request`, an agent asking for what it was refused.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::FromRequest;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use super::listing::non_empty;
use super::query::page_size;
use crate::app::proposals::{
    Applied, Draft, Window, MAX_DAYS, MAX_LIST, MAX_PATCH_BYTES, MAX_REPLAY_DECISIONS, MAX_TEXT,
};
use crate::app::App;
use crate::audit::proposals::{ProposalOrigin, ProposalRow, ProposalStatus};
use crate::role::Role;
use api_types::AccessRequested;

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

/// `GET /v1/policy/proposals`: a page, newest first. (Fields alphabetical, as the answer always
/// had them: it was a `json!` object, whose keys serde_json sorts.)
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProposalPage {
    /// Pass as `before` for the next (older) page; `null` on the last page.
    pub next_before: Option<String>,
    /// Each with the evidence's counts, without its `files`.
    pub proposals: Vec<ProposalRow>,
}

/// `POST /v1/policy/proposals/{id}/approve`: the proposal and what approving it applied.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovedProposal {
    pub applied: Applied,
    pub proposal: ProposalRow,
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
        (status = 201, description = "the proposal with its evidence", body = ProposalRow),
        (status = 422, description = "no_suggestion: the bundle suggests nothing for that execution", body = super::error::ErrorBody),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<(axum::http::StatusCode, Json<ProposalRow>), ApiError> {
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
        origin: ProposalOrigin::Reviewer,
        window,
    };
    let row = app.create_proposal(&caller.0, draft).await?;
    Ok((axum::http::StatusCode::CREATED, Json(row)))
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
        (status = 200, description = "a page of proposals", body = ProposalPage),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    query: Result<Query<ProposalQuery>, QueryRejection>,
) -> Result<Json<ProposalPage>, ApiError> {
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
    let proposals = rows.into_iter().map(summary).collect();
    Ok(Json(ProposalPage {
        next_before,
        proposals,
    }))
}

/// A listed proposal: the evidence's counts, not its examples and files.
fn summary(mut row: ProposalRow) -> ProposalRow {
    if let Some(evidence) = row.evidence.0.as_object_mut() {
        evidence.remove("files");
    }
    row
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
        (status = 200, description = "the proposal", body = ProposalRow),
        super::openapi::ApiErrors,
    ),
)]
pub async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ProposalRow>, ApiError> {
    caller.require_role(READERS)?;
    Ok(Json(app.get_proposal(&id).await?))
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
        (status = 200, description = "the proposal and the reload it made", body = ApprovedProposal),
        super::openapi::ApiErrors,
    ),
)]
pub async fn approve(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<ApprovedProposal>, ApiError> {
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
    Ok(Json(ApprovedProposal {
        applied,
        proposal: row,
    }))
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
        (status = 200, description = "the proposal", body = ProposalRow),
        super::openapi::ApiErrors,
    ),
)]
pub async fn reject(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<ProposalRow>, ApiError> {
    caller.require_role(DECIDERS)?;
    let verdict: Verdict = super::policy::optional_body(body).await?;
    let comment = verdict
        .comment
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "a rejection needs a comment"))?;
    let row = app
        .reject_proposal(&caller.0, &id, bounded("comment", comment)?)
        .await?;
    Ok(Json(row))
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
        (status = 200, description = "the proposal", body = ProposalRow),
        super::openapi::ApiErrors,
    ),
)]
pub async fn rebase(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<ProposalRow>, ApiError> {
    caller.require_role(DECIDERS)?;
    let request: Rebase = super::policy::optional_body(body).await?;
    let window = window(request.days, request.replay_limit)?;
    let row = app.rebase_proposal(&caller.0, &id, window).await?;
    Ok(Json(row))
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
        (status = 201, description = "the proposal opened for a reviewer (its id and status; reviewers read its patch)", body = AccessRequested),
        (status = 422, description = "no_suggestion", body = super::error::ErrorBody),
        super::openapi::ApiErrors,
    ),
)]
pub async fn access_request(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<(axum::http::StatusCode, Json<AccessRequested>), ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiJson(request) = ApiJson::<AccessRequest>::from_request(body, &app).await?;
    let justification = bounded("justification", request.justification)?;
    let row = app.request_access(&caller.0, &id, justification).await?;
    Ok((
        axum::http::StatusCode::CREATED,
        Json(AccessRequested {
            proposal_id: row.id,
            status: row.status,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use serde::Serialize;
    use serde_json::json;

    use super::*;
    use crate::audit::egress::ConnectionRow;
    use crate::audit::review::RequestRow;

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-03T09:30:00.123456Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    /// What axum writes for `typed` is what `json!(typed)` wrote before (serde_json's map sorts
    /// the keys, so this holds when every struct declares its fields alphabetically).
    fn as_before<T: Serialize>(typed: &T) {
        assert_eq!(
            serde_json::to_string(typed).unwrap(),
            json!(typed).to_string()
        );
    }

    fn row() -> ProposalRow {
        ProposalRow {
            author_key_id: "key_1".into(),
            author_principal: "ana".into(),
            author_tenant: "acme".into(),
            base_revision: "sha256:aa".into(),
            candidate_revision: "sha256:bb".into(),
            comment: None,
            created_at: at(),
            decided_at: Some(at()),
            decided_by: None,
            evidence: sqlx::types::Json(json!({"tests": {"passed": true}, "files": {"a": 1}})),
            id: "pp_1".into(),
            justification: Some("need pypi".into()),
            origin: ProposalOrigin::Agent,
            patch: sqlx::types::Json(json!({"data/tenants.yaml": {"acme": {"hosts": ["x"]}}})),
            rationale: "why".into(),
            source_approval: None,
            source_execution: Some("ex_1".into()),
            status: ProposalStatus::Open,
            tests_passed: true,
            title: "Allow x".into(),
        }
    }

    #[test]
    fn proposal_answers_are_written_as_before() {
        as_before(&row());
        let listed = summary(row());
        assert!(listed.evidence.0.get("files").is_none());
        as_before(&ProposalPage {
            next_before: None,
            proposals: vec![listed],
        });
        as_before(&ApprovedProposal {
            applied: Applied {
                policy_dir_error: Some("read-only".into()),
                policy_dir_written: false,
                previous: "sha256:aa".into(),
                revision: "sha256:bb".into(),
            },
            proposal: row(),
        });
        let requested = AccessRequested {
            proposal_id: "pp_1".into(),
            status: ProposalStatus::Open,
        };
        assert_eq!(
            serde_json::to_value(&requested).unwrap(),
            json!({"proposal_id": "pp_1", "status": "open"}),
            "the agent is not shown the patch (the tenant's allowlist, its credential names)"
        );
    }

    #[test]
    fn connection_answers_are_written_as_before() {
        let connection = ConnectionRow {
            allow: true,
            bytes_down: 10,
            bytes_up: 5,
            close_reason: Some("eof".into()),
            closed_at: Some(at()),
            duration_ms: Some(3),
            error: None,
            host: "pypi.org".into(),
            id: "cn_1".into(),
            message: "allowed".into(),
            method: None,
            opened_at: at(),
            path: None,
            policy_revision: "sha256:aa".into(),
            port: 443,
            reason: "egress.allowed".into(),
            resolved_addr: Some("1.2.3.4:443".into()),
            scheme: "tls".into(),
            sni: Some("pypi.org".into()),
        };
        let request = RequestRow {
            allow: false,
            bytes_down: 0,
            bytes_up: 0,
            connection_id: "cn_1".into(),
            credentials: vec!["github".into()],
            duration_ms: None,
            host: "pypi.org".into(),
            id: "rq_1".into(),
            message: "m".into(),
            method: "GET".into(),
            path: "/simple".into(),
            port: 443,
            reason: "r".into(),
            started_at: at(),
            status_code: Some(200),
        };
        let typed = crate::api::executions::Connections {
            connections: vec![connection.clone()],
            requests: vec![request.clone()],
        };
        assert_eq!(
            serde_json::to_string(&typed).unwrap(),
            json!({ "connections": [connection], "requests": [request] }).to_string()
        );
    }
}
