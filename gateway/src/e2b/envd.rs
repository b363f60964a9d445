//! envd, the in-sandbox API, as the E2B SDKs reach it through `E2B_SANDBOX_URL`: every call
//! names its sandbox (`E2b-Sandbox-Id`) and carries that sandbox's access token
//! (`X-Access-Token`), checked against the hashes issued for that one sandbox; the sandbox id
//! alone is never trusted. What every envd service shares: reaching the sandbox, Connect's
//! codec check and answers, `/health` and `/envs`. `process.Process` is `super::process`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::connect::{end_stream, Code, ConnectError, STREAM_CONTENT_TYPE, UNARY_CONTENT_TYPE};
use super::live::{Live, LiveSandbox};
use super::refuse;
use crate::app::refusals::RefusalKind;
use crate::app::{App, AppError};
use crate::audit::ApiKey;

/// Longest wait for a finished command's session to be released.
const SETTLE: Duration = Duration::from_secs(2);

pub(super) type LiveState = Extension<Arc<Live>>;

/// A call's sandbox, by its id and access token.
pub(super) struct Reached {
    pub(super) id: String,
    pub(super) key: ApiKey,
    pub(super) sandbox: Arc<LiveSandbox>,
}

fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The sandbox of an envd call, by `E2b-Sandbox-Id` and `X-Access-Token`.
pub(super) async fn reach(
    app: &App,
    live: &Arc<Live>,
    parts: &Parts,
) -> Result<Reached, ConnectError> {
    reach_by(app, live, parts, &["x-access-token"]).await
}

/// The sandbox of a code interpreter call (`/execute`, `/contexts`): its token as
/// `X-Access-Token` or, as the interpreter SDK sends it on `/contexts` (which carry no
/// `X-Access-Token`), `E2B-Traffic-Access-Token`. Both are the one access token of that
/// sandbox (the create's `trafficAccessToken` is its `envdAccessToken`), checked alike.
pub(super) async fn reach_interpreter(
    app: &App,
    live: &Arc<Live>,
    parts: &Parts,
) -> Result<Reached, ConnectError> {
    reach_by(
        app,
        live,
        parts,
        &["x-access-token", "e2b-traffic-access-token"],
    )
    .await
}

async fn reach_by(
    app: &App,
    live: &Arc<Live>,
    parts: &Parts,
    token_headers: &[&str],
) -> Result<Reached, ConnectError> {
    let Some(id) = header(parts, "e2b-sandbox-id") else {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "no E2b-Sandbox-Id header: which sandbox is this call for?",
        ));
    };
    let Some(token) = token_headers.iter().find_map(|name| header(parts, name)) else {
        let _ = refuse(
            app,
            parts,
            RefusalKind::AuthFailure,
            None,
            "e2b.access_token_missing",
        )
        .await;
        return Err(ConnectError::new(
            Code::Unauthenticated,
            format!("no X-Access-Token: calls to sandbox {id} need the access token its create or connect answer gave"),
        ));
    };
    let found = app.audit.e2b_by_token(id, token).await.map_err(|err| {
        tracing::error!(error = %crate::errors::error_chain(&err), "access token lookup failed");
        ConnectError::new(Code::Unavailable, "the audit store is unavailable")
    })?;
    let Some((row, key)) = found else {
        let _ = refuse(
            app,
            parts,
            RefusalKind::AuthFailure,
            None,
            "e2b.access_token_invalid",
        )
        .await;
        return Err(ConnectError::new(
            Code::Unauthenticated,
            format!("the access token is not valid for sandbox {id}"),
        ));
    };
    let sandbox = match live.get(id) {
        Some(sandbox) => sandbox,
        // Served by another replica until now, or this gateway restarted: no envVars here.
        None => live.insert(
            id,
            LiveSandbox::new(key.clone(), BTreeMap::new(), row.end_at),
        ),
    };
    Ok(Reached {
        id: id.to_owned(),
        key,
        sandbox,
    })
}

/// `GET /health`: 204 while the sandbox's session is open, 502 once it is gone (what the SDKs'
/// `is_running` reads as "not running").
pub async fn health(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return unary_error(&err),
    };
    match app.get_session(&reached.key, &reached.id).await {
        Ok(row) if !row.is(crate::session_wire::SessionStatus::Closed) => {
            StatusCode::NO_CONTENT.into_response()
        }
        _ => (
            StatusCode::BAD_GATEWAY,
            format!("sandbox {} is not running", reached.id),
        )
            .into_response(),
    }
}

/// `GET /envs`: the sandbox's `envVars` (given at create; only its token's holder sees them).
pub async fn envs(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
) -> Response {
    match reach(&app, &live, &parts).await {
        Ok(reached) => Json(&reached.sandbox.envs).into_response(),
        Err(err) => unary_error(&err),
    }
}

/// Only Connect's JSON codec: what the E2B SDKs send.
pub(super) fn json_codec(parts: &Parts, streaming: bool) -> Result<(), ConnectError> {
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let expected = if streaming {
        STREAM_CONTENT_TYPE
    } else {
        UNARY_CONTENT_TYPE
    };
    if media.eq_ignore_ascii_case(expected) {
        return Ok(());
    }
    Err(ConnectError::new(
        Code::InvalidArgument,
        format!(
            "content-type {media:?} is not accepted here: send {expected} (Connect's JSON codec)"
        ),
    ))
}

/// Waits (at most [`SETTLE`]) until the session no longer counts as busy: its record is
/// finished a moment before the session is released, and the SDK's next call (a command, a
/// file operation) would otherwise find it busy.
pub(super) async fn settled(app: &App, reached: &Reached) {
    let deadline = tokio::time::Instant::now() + SETTLE;
    while tokio::time::Instant::now() < deadline {
        match app.get_session(&reached.key, &reached.id).await {
            Ok(row) if row.is(crate::session_wire::SessionStatus::Busy) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            _ => return,
        }
    }
}

pub(super) fn connect_error(err: AppError) -> ConnectError {
    let code = match &err {
        AppError::Invalid(_) | AppError::NoSuggestion(_) => Code::InvalidArgument,
        AppError::NotFound | AppError::NotFoundWhy(_) => Code::NotFound,
        AppError::Forbidden(_) => Code::PermissionDenied,
        // One command at a time in a sandbox (its session runs one execution at a time).
        AppError::Conflict(_) | AppError::RevisionConflict(_) => Code::FailedPrecondition,
        AppError::RateLimited(_) => Code::ResourceExhausted,
        AppError::Unavailable(_) | AppError::ReplicaUnavailable(_) => Code::Unavailable,
        AppError::Internal(_) => Code::Internal,
    };
    let message = match err {
        AppError::Unavailable(_) => "the audit store is unavailable".to_owned(),
        AppError::Internal(_) => "internal error".to_owned(),
        other => other.to_string(),
    };
    ConnectError::new(code, message)
}

pub(super) fn unary<T: serde::Serialize>(value: &T) -> Response {
    (
        StatusCode::OK,
        [(CONTENT_TYPE, UNARY_CONTENT_TYPE)],
        serde_json::to_vec(value).unwrap_or_default(),
    )
        .into_response()
}

pub(super) fn unary_error(err: &ConnectError) -> Response {
    (
        err.code.http_status(),
        [(CONTENT_TYPE, UNARY_CONTENT_TYPE)],
        err.to_json().to_string(),
    )
        .into_response()
}

/// A stream's error is its end-of-stream message, with HTTP 200 (Connect's streaming rule).
pub(super) fn answer_error(err: &ConnectError, streaming: bool) -> Response {
    if !streaming {
        return unary_error(err);
    }
    (
        StatusCode::OK,
        [(CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        end_stream(Some(err)),
    )
        .into_response()
}
