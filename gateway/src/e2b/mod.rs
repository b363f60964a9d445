//! The E2B-compatible API (DESIGN section 14, docs/e2b.md), served under `/e2b` on the main
//! listener: E2B's control plane (`/sandboxes`, `/v2/sandboxes`) and its in-sandbox API (envd:
//! Connect's `process.Process`, `/health`, `/envs`) as the unchanged E2B SDKs call them with
//! `E2B_API_URL` and `E2B_SANDBOX_URL` pointed here.
//!
//! A layer over `app`, never beside it: an E2B sandbox is a sandgate session opened with
//! `App::create_session` (`request.kind` `"session"`, `request.e2b`), every process start a
//! session execution through `App::start_session_process` and every cell through
//! `App::create_session_execution` (`request.e2b.call`), so each is
//! decided by the policy, committed before it runs and recorded with its output and exit. This
//! module holds no sandbox and runs nothing itself; what it adds is E2B's wire (`wire`,
//! `connect`), the per-sandbox access tokens (stored hashed, `audit::e2b_sandboxes`), and the sandbox's
//! E2B lifetime (`live`), which only ever shortens the session's.

pub mod connect;
mod control;
mod envd;
pub mod error;
mod files;
mod filesystem;
mod follow;
mod fork;
mod interpreter;
mod live;
mod process;
mod watch;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{any, get, post};
use axum::{Extension, Router};
use serde_json::json;

use crate::app::refusals::{bounded_text, Refusal, RefusalKind, Verdict};
use crate::app::App;
use crate::audit::ApiKey;
use crate::role::Role;
use error::E2bError;

/// The `/e2b` routes (nested there by `api::router` when `e2b.enabled`).
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/sandboxes", post(control::create).get(control::list_all))
        .route("/v2/sandboxes", post(control::create).get(control::list))
        .route("/sandboxes/{id}", get(control::info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/snapshots", post(control::snapshot))
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/sandboxes/{id}/{action}", any(control::unsupported))
        .route("/health", get(envd::health))
        .route("/envs", get(envd::envs))
        .route("/process.Process/{method}", post(process::process))
        .route(
            "/filesystem.Filesystem/{method}",
            post(filesystem::filesystem),
        )
        .route("/files", get(files::download).post(files::upload))
        .route("/execute", post(interpreter::execute))
        .route("/contexts", any(interpreter::contexts))
        .route("/contexts/{*rest}", any(interpreter::context))
        .fallback(control::no_such_route)
        .layer(Extension(Arc::new(live::Live::default())))
}

/// The agent key of a control-plane call: `X-API-KEY` (the SDKs' header) or
/// `Authorization: Bearer`. A failure is audited and throttled like every failed
/// authentication (`app::refusals`).
async fn api_caller(app: &App, parts: &Parts) -> Result<ApiKey, E2bError> {
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let secret = header("x-api-key").or_else(|| {
        header(AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer ").map(str::trim))
    });
    let found = match secret {
        Some(secret) => app.audit.find_key(secret).await.map_err(|err| {
            tracing::error!(error = %crate::errors::error_chain(&err), "key lookup failed");
            E2bError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the audit store is unavailable",
            )
        })?,
        None => None,
    };
    let Some(key) = found else {
        let code = if secret.is_some() {
            "auth.unknown_key"
        } else {
            "auth.missing"
        };
        let claimed = secret.and_then(crate::audit::claimed_key_id);
        refuse(app, parts, RefusalKind::AuthFailure, claimed, code).await?;
        return Err(E2bError::new(
            StatusCode::UNAUTHORIZED,
            "send a sandgate agent key as X-API-KEY (E2B_API_KEY) or Authorization: Bearer",
        ));
    };
    if key.role != Role::Agent {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!(
                "key {} is a {} key; E2B sandboxes need an agent key",
                key.id, key.role
            ),
        ));
    }
    Ok(key)
}

/// Records a refusal (bounded, `app::refusals`); past the rate, 429.
async fn refuse(
    app: &App,
    parts: &Parts,
    kind: RefusalKind,
    key_id: Option<String>,
    code: &str,
) -> Result<(), E2bError> {
    let refusal = Refusal {
        kind,
        source: source(parts),
        key_id,
        tenant: None,
        code: code.to_owned(),
        detail: json!({
            "method": bounded_text(parts.method.as_str()),
            "path": bounded_text(parts.uri.path()),
        }),
    };
    match app.refuse(refusal).await {
        Ok(Verdict::Throttled { .. }) => Err(E2bError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too many refused requests from here; wait before trying again",
        )),
        Ok(Verdict::Record | Verdict::Counted) => Ok(()),
        Err(err) => {
            tracing::error!(error = %crate::errors::error_chain(&err), "auditing a refusal failed");
            Err(E2bError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the audit store is unavailable",
            ))
        }
    }
}

fn source(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip())
}
