//! The HTTP edge (axum): routing, authentication, the error shape. Handlers translate between
//! HTTP and the use cases in `app`; no SQL or Docker here.

pub mod approvals;
pub mod audit;
pub mod auth;
pub mod error;
pub mod executions;
pub mod health;
pub mod json;
pub mod payloads;
pub mod policy;
pub mod ui;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tracing::Instrument;

use crate::app::App;
use error::{ApiError, ErrorCode};

/// Largest request body; checked while the body streams in (413 before it is all read).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route(
            "/v1/executions",
            post(executions::create).get(approvals::list_executions),
        )
        .route("/v1/executions/{id}", get(executions::get))
        .route("/v1/executions/{id}/cancel", post(executions::cancel))
        .route(
            "/v1/executions/{id}/connections",
            get(executions::connections),
        )
        .route("/v1/executions/{id}/events", get(payloads::events))
        .route(
            "/v1/executions/{id}/outputs/{*path}",
            get(payloads::download),
        )
        .route("/v1/approvals", get(approvals::list))
        .route(
            "/v1/approvals/{id}",
            get(approvals::get).post(approvals::decide),
        )
        .route("/v1/audit/verify", get(audit::verify))
        .merge(ui::router())
        .route("/v1/policy", get(policy::show))
        .route("/v1/policy/evaluate", post(policy::evaluate))
        .route("/v1/policy/reload", post(policy::reload))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(request_span))
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

/// One span per request, and its id echoed in `x-request-id`.
async fn request_span(request: Request, next: Next) -> Response {
    let request_id = crate::ids::new("rq");
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    let mut response = next.run(request).instrument(span.clone()).await;
    span.in_scope(|| tracing::debug!(status = response.status().as_u16(), "response"));
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}
