//! The review page (`/ui/`): static HTML, one script and one style sheet, compiled into the
//! binary. No CDN and no inline script: every answer carries `Content-Security-Policy:
//! default-src 'self'`. The page itself holds no data; it calls the JSON API with the key the
//! user pastes (kept in `sessionStorage`), so the API's role checks apply unchanged.

use axum::http::header::{self, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/style.css");

/// The policy every page answer carries.
pub const CSP: &str =
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// `/ui`: to the page.
#[utoipa::path(
    get,
    path = "/ui",
    tag = "ui",
    operation_id = "ui_redirect",
    summary = "The review page (redirect).",
    security(()),
    responses(
        (status = 308, description = "to /ui/"),
    ),
)]
pub async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `/ui/`: the page.
#[utoipa::path(
    get,
    path = "/ui/",
    tag = "ui",
    operation_id = "ui_index",
    summary = "The review page.",
    security(()),
    responses(
        (status = 200, description = "HTML", body = String, content_type = "text/html"),
    ),
)]
pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// `/ui/app.js`
#[utoipa::path(
    get,
    path = "/ui/app.js",
    tag = "ui",
    operation_id = "ui_script",
    summary = "The review page script.",
    security(()),
    responses(
        (status = 200, description = "JavaScript", body = String, content_type = "text/javascript"),
    ),
)]
pub async fn script() -> Response {
    page("text/javascript; charset=utf-8", SCRIPT)
}

/// `/ui/style.css`
#[utoipa::path(
    get,
    path = "/ui/style.css",
    tag = "ui",
    operation_id = "ui_style",
    summary = "The review page style.",
    security(()),
    responses(
        (status = 200, description = "CSS", body = String, content_type = "text/css"),
    ),
)]
pub async fn style() -> Response {
    page("text/css; charset=utf-8", STYLE)
}

fn page(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    (headers, body).into_response()
}
