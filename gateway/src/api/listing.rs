//! `GET /v1/executions?status=&tenant=&limit=&before=`: executions, newest first, one bounded
//! page at a time. Agents see their own tenant's only (`tenant` is ignored for them); reviewers,
//! auditors and admins see every tenant's.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Caller;
use super::error::ApiError;
use super::query::{page_size, ApiQuery};
use crate::app::App;
use crate::audit::read::{ExecutionFilter, ExecutionSummary};

/// Page size when `limit` is absent.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page; a bigger `limit` is lowered to it.
pub const MAX_LIMIT: u32 = 500;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    tenant: Option<String>,
    limit: Option<u32>,
    /// The id of the last execution of the previous page.
    before: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ExecutionPage {
    pub executions: Vec<ExecutionSummary>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<String>,
}

pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<ExecutionPage>, ApiError> {
    caller.require_role(&["agent", "reviewer", "auditor", "admin"])?;
    let limit = page_size(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let filter = ExecutionFilter {
        tenant: non_empty(query.tenant),
        status: non_empty(query.status),
        before: non_empty(query.before),
        limit,
    };
    let executions = app.list_executions(&caller.0, filter).await?;
    let next_before = (executions.len() as i64 == limit)
        .then(|| executions.last().map(|row| row.id.clone()))
        .flatten();
    Ok(Json(ExecutionPage {
        executions,
        next_before,
    }))
}

/// `?status=` (empty) means no filter.
pub fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|value| !value.is_empty())
}
