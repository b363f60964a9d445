//! `GET /metrics`: the Prometheus scrape (auditor or admin key). The series are built in
//! `crate::metrics`; this checks the caller, reads the warm pool's waiting sandboxes into their
//! gauge (the pool is the source of truth; asking it at scrape time keeps them equal) and sets
//! the content type.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use super::auth::Caller;
use super::error::ApiError;
use crate::app::App;
use crate::role::Role;

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "metrics",
    operation_id = "metrics_scrape",
    summary = "Prometheus metrics (text exposition format 0.0.4).",
    security(("bearer" = ["auditor", "admin"])),
    responses(
        (status = 200, description = "the sandgate_* series", body = String, content_type = "text/plain"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn scrape(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<impl IntoResponse, ApiError> {
    caller.require_role(&[Role::Auditor, Role::Admin])?;
    let metrics = app.audit.metrics();
    let warm = app.pool.snapshot();
    for (language, waiting) in &warm.waiting {
        metrics.set_warm_pool_ready(language, i64::try_from(*waiting).unwrap_or(i64::MAX));
    }
    metrics.set_warm(warm);
    // Sessions open on this replica (each replica reports its own; `v_sessions_open` has all).
    metrics.set_sessions_open(i64::try_from(app.sessions.open_here()).unwrap_or(i64::MAX));
    let mut text = metrics.render();
    app.proposal_builds.render(&mut text);
    Ok(([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text))
}
