//! The review page (`/ui/`) and the auditor's charts (`/ui/audit.html`): static HTML, scripts,
//! one style sheet and the vendored chart library, compiled into the binary. No CDN and no inline script: every answer carries `Content-Security-Policy:
//! default-src 'self'`. The page itself holds no data; it calls the JSON API with the key the
//! user pastes (kept in `sessionStorage`), so the API's role checks apply unchanged.

use axum::extract::Path;
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};

use super::error::{ApiError, ErrorCode};

const INDEX: &str = include_str!("../../ui/index.html");

/// The page's other files, by the one name each is served under (`/ui/{file}`). Nothing else
/// is served: an unknown name is a 404, and no name reaches the file system.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "detail.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/detail.js"),
    ),
    (
        "proposals.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/proposals.js"),
    ),
    (
        "common.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/common.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/style.css"),
    ),
    (
        "audit.html",
        "text/html; charset=utf-8",
        include_str!("../../ui/audit.html"),
    ),
    (
        "audit.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/audit.js"),
    ),
    // Chart.js 4.6.1 from npm, unmodified (MIT; gateway/ui/vendor/README.md).
    (
        "chart.umd.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/vendor/chart.umd.min.js"),
    ),
];

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

/// `/ui/{file}`: one of the page's compiled-in files.
#[utoipa::path(
    get,
    path = "/ui/{file}",
    tag = "ui",
    operation_id = "ui_asset",
    summary = "A file of the review and audit pages (scripts, style sheet, the audit page, the vendored chart library).",
    security(()),
    params(
        ("file" = String, Path, description = "app.js, detail.js, common.js, style.css, audit.html, audit.js or chart.umd.min.js"),
    ),
    responses(
        (status = 200, description = "the file", body = String),
        (status = 404, description = "no such file"),
    ),
)]
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => page(content_type, body),
        None => ApiError::new(ErrorCode::NotFound, format!("no page file named {file:?}"))
            .into_response(),
    }
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
