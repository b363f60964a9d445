//! `GET /v1/audit/summary?since=24h` (auditor, admin): what the auditor page (`/ui/audit.html`)
//! charts, aggregated from the `v_*` views the Grafana dashboards read.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::audit::parse_since;
use super::auth::Caller;
use super::error::ApiError;
use super::listing::non_empty;
use super::query::ApiQuery;
use crate::app::{App, AppError};
use crate::audit::charts::Summary;
use crate::role::Role;

/// The window when `since` is absent.
const DEFAULT_SINCE: &str = "24h";
/// About this many time buckets per window; each at least a minute.
const BUCKETS: i64 = 48;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryQuery {
    /// RFC 3339 time, or a duration back from now (`24h`, `7d`); default `24h`.
    since: Option<String>,
}

#[utoipa::path(
    get,
    path = "/v1/audit/summary",
    tag = "audit",
    operation_id = "audit_summary",
    summary = "Decisions, denials, egress, waiting approvals, executions and open sessions, aggregated for charts.",
    security(("bearer" = ["auditor", "admin"])),
    params(
        ("since" = Option<String>, Query, description = "RFC 3339 time or a duration back from now (24h, 7d); default 24h"),
    ),
    responses(
        (status = 200, description = "the series", body = Summary),
        super::openapi::ApiErrors,
    ),
)]
pub async fn summary(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SummaryQuery>,
) -> Result<Json<Summary>, ApiError> {
    caller.require_role(&[Role::Auditor, Role::Admin])?;
    let since_text = non_empty(query.since).unwrap_or_else(|| DEFAULT_SINCE.to_owned());
    let since = parse_since(&since_text)?;
    let window = (chrono::Utc::now() - since).num_seconds().max(60);
    // Whole minutes, so buckets line up with the clock.
    let bucket = ((window / BUCKETS).max(60) + 59) / 60 * 60;
    let summary = app
        .audit
        .summary(since, bucket)
        .await
        .map_err(AppError::from)?;
    Ok(Json(summary))
}
