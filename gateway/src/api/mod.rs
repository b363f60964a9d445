//! The HTTP edge (axum): routing, authentication, the error shape. Handlers translate between
//! HTTP and the use cases in `app`; no SQL or Docker here.

pub mod approvals;
pub mod audit;
pub mod auth;
pub mod charts;
pub mod error;
pub mod executions;
pub mod health;
pub mod json;
pub mod keys;
pub mod listing;
pub mod mcp;
pub mod me;
pub mod metrics;
pub mod openapi;
pub mod payloads;
pub mod policy;
pub mod proposals;
pub mod query;
pub mod session_files;
pub mod sessions;
pub mod snapshots;
pub mod ui;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::handler::Handler;
use axum::http::{HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::Router;
use tracing::Instrument;

use crate::app::App;
use error::{ApiError, ErrorCode};

/// Largest request body; checked while the body streams in (413 before it is all read).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// One route of the API. [`routes`] is the single list the router is built from, and
/// `gateway/tests/e2e/routes.rs` checks it, role by role, against `gateway/tests/routes.table`: a
/// route added here without a row there fails that test.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    handler: MethodRouter<Arc<App>>,
}

fn get<H, T>(path: &'static str, handler: H) -> Route
where
    H: Handler<T, Arc<App>>,
    T: 'static,
{
    Route {
        method: Method::GET,
        path,
        handler: routing::get(handler),
    }
}

fn delete<H, T>(path: &'static str, handler: H) -> Route
where
    H: Handler<T, Arc<App>>,
    T: 'static,
{
    Route {
        method: Method::DELETE,
        path,
        handler: routing::delete(handler),
    }
}

fn post<H, T>(path: &'static str, handler: H) -> Route
where
    H: Handler<T, Arc<App>>,
    T: 'static,
{
    Route {
        method: Method::POST,
        path,
        handler: routing::post(handler),
    }
}

fn put<H, T>(path: &'static str, handler: H) -> Route
where
    H: Handler<T, Arc<App>>,
    T: 'static,
{
    Route {
        method: Method::PUT,
        path,
        handler: routing::put(handler),
    }
}

/// Every route. Who may call each one is decided in its handler (`Caller::require_role`, and
/// tenant scoping in `app`); `tests/routes.table` states it for every route and role.
pub fn routes() -> Vec<Route> {
    vec![
        get("/healthz", health::healthz),
        get("/readyz", health::readyz),
        get("/metrics", metrics::scrape),
        get("/v1/openapi.json", openapi::document),
        post("/mcp", mcp::serve),
        post("/v1/executions", executions::create),
        get("/v1/executions", listing::list),
        get("/v1/executions/{id}", executions::get),
        post("/v1/executions/{id}/cancel", executions::cancel),
        get("/v1/executions/{id}/connections", executions::connections),
        get("/v1/executions/{id}/events", payloads::events),
        get("/v1/executions/{id}/outputs/{*path}", payloads::download),
        post("/v1/sessions", sessions::create),
        get("/v1/sessions", sessions::list),
        get("/v1/sessions/{id}", sessions::get),
        delete("/v1/sessions/{id}", sessions::delete),
        post("/v1/sessions/{id}/executions", sessions::execute),
        get("/v1/sessions/{id}/files", session_files::list),
        delete("/v1/sessions/{id}/files", session_files::remove),
        get("/v1/sessions/{id}/files/stat", session_files::stat),
        get("/v1/sessions/{id}/files/content", session_files::read),
        put("/v1/sessions/{id}/files/content", session_files::write),
        post("/v1/sessions/{id}/files/mkdir", session_files::mkdir),
        post("/v1/sessions/{id}/files/move", session_files::rename),
        post("/v1/sessions/{id}/pause", snapshots::pause),
        post("/v1/sessions/{id}/resume", snapshots::resume),
        post("/v1/sessions/{id}/snapshots", snapshots::create),
        get("/v1/snapshots", snapshots::list),
        get("/v1/snapshots/{id}", snapshots::get),
        delete("/v1/snapshots/{id}", snapshots::delete),
        get("/v1/approvals", approvals::list),
        get("/v1/approvals/{id}", approvals::get),
        post("/v1/approvals/{id}", approvals::decide),
        get("/v1/audit/events", audit::events),
        get("/v1/audit/verify", audit::verify),
        get("/v1/audit/summary", charts::summary),
        get("/v1/policy", policy::show),
        post("/v1/policy/evaluate", policy::evaluate),
        post("/v1/policy/reload", policy::reload),
        post("/v1/policy/rollback", policy::rollback),
        post("/v1/policy/proposals", proposals::create),
        get("/v1/policy/proposals", proposals::list),
        get("/v1/policy/proposals/{id}", proposals::get),
        post("/v1/policy/proposals/{id}/approve", proposals::approve),
        post("/v1/policy/proposals/{id}/reject", proposals::reject),
        post("/v1/policy/proposals/{id}/rebase", proposals::rebase),
        post(
            "/v1/executions/{id}/access-request",
            proposals::access_request,
        ),
        post("/v1/keys", keys::create),
        get("/v1/keys", keys::list),
        get("/v1/me", me::me),
        delete("/v1/keys/{id}", keys::revoke),
        // The review page: static, no key; it calls the API above with the user's key.
        get("/ui", ui::redirect),
        get("/ui/", ui::index),
        get("/ui/{file}", ui::asset),
    ]
}

/// The router: [`routes`] and nothing else (a route added here would escape `tests/e2e/routes.rs`).
pub fn router(app: Arc<App>) -> Router {
    let router = routes().into_iter().fold(Router::new(), |router, route| {
        router.route(route.path, route.handler)
    });
    // The E2B-compatible API speaks E2B's wire, not this one's: its own routes and error shape
    // (`crate::e2b`, docs/e2b.md); with `e2b.enabled: false` its paths are this API's 404.
    let router = if app.config.e2b.enabled {
        router.nest("/e2b", crate::e2b::router())
    } else {
        router
    };
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(refuse_nul_in_target))
        .layer(middleware::from_fn(request_span))
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

/// A known path with the wrong method: the API's error shape (405), not an empty body.
async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not take that method",
    )
}

/// A NUL byte (`%00`) anywhere in the path or the query string is a 400 before any route
/// sees it: no id, filter or name may carry one to the database (whose text refuses it, which
/// would otherwise read as the store being down, 503) or into an audit row.
async fn refuse_nul_in_target(request: Request, next: Next) -> Response {
    let uri = request.uri();
    let carries_nul = [Some(uri.path()), uri.query()]
        .into_iter()
        .flatten()
        .any(decodes_to_nul);
    if carries_nul {
        return ApiError::new(
            ErrorCode::InvalidRequest,
            "the request path and query must not contain a NUL byte (%00)",
        )
        .into_response();
    }
    next.run(request).await
}

/// Whether `text` holds NUL, raw or percent-encoded (`%00`).
fn decodes_to_nul(text: &str) -> bool {
    text.contains('\0')
        || text
            .as_bytes()
            .windows(3)
            .any(|w| w[0] == b'%' && w[1] == b'0' && w[2] == b'0')
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
