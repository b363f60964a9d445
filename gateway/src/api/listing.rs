//! `GET /v1/executions?status=&tenant=&label=&session=&limit=&before=`: executions, newest first, one bounded
//! page at a time, each as `GET /v1/executions/{id}` shows it but without `stdout` and `stderr`.
//! Agents see their own tenant's only (`tenant` is ignored for them); reviewers, auditors and
//! admins see every tenant's.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::auth::Caller;
use super::error::ApiError;
use super::executions::ExecutionView;
use super::query::{page_size, ApiQuery};
use crate::app::App;
use crate::audit::read::ExecutionFilter;
use crate::role::Role;

/// Page size when `limit` is absent.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page; a bigger `limit` is lowered to it.
pub const MAX_LIMIT: u32 = 500;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    tenant: Option<String>,
    /// `key=value`: only executions carrying that label.
    label: Option<String>,
    /// `ss_...`: only the executions of that session.
    session: Option<String>,
    limit: Option<u32>,
    /// The id of the last execution of the previous page.
    before: Option<String>,
}

pub use api_types::ExecutionPage;

#[utoipa::path(
    get,
    path = "/v1/executions",
    tag = "listing",
    operation_id = "listing_list",
    summary = "Executions, newest first, one page at a time.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("status" = Option<String>, Query),
        ("tenant" = Option<String>, Query),
        ("label" = Option<String>, Query, description = "`key=value`: only executions with that label"),
        ("session" = Option<String>, Query, description = "only the executions of that session"),
        ("limit" = Option<u32>, Query),
        ("before" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "a page", body = ExecutionPage),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<ExecutionPage>, ApiError> {
    caller.require_role(&[Role::Agent, Role::Reviewer, Role::Auditor, Role::Admin])?;
    let limit = page_size(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let filter = ExecutionFilter {
        tenant: non_empty(query.tenant),
        status: non_empty(query.status),
        label: non_empty(query.label).map(label_pair).transpose()?,
        session: non_empty(query.session),
        before: non_empty(query.before),
        limit,
    };
    let rows = app.list_executions(&caller.0, filter).await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|row| row.id.clone()))
        .flatten();
    let executions = rows.into_iter().map(ExecutionView::from).collect();
    Ok(Json(ExecutionPage {
        executions,
        next_before,
    }))
}

/// `label=key=value` as its two parts; the value may be empty, the key may not.
fn label_pair(text: String) -> Result<(String, String), ApiError> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(ApiError::new(
            super::error::ErrorCode::InvalidRequest,
            format!("label must be key=value (like label=agent=analyst-7), not {text:?}"),
        )),
    }
}

/// `?status=` (empty) means no filter.
pub fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|value| !value.is_empty())
}
