//! `POST /sandboxes/{id}/fork` (the SDK's `sbx.fork(count=N)` / `Sandbox.fork(id)`): the
//! sandbox is snapshotted once (sandgate's kept snapshot: it goes on, its id and end untouched)
//! and `count` new sandboxes are created from that snapshot, each exactly as
//! `Sandbox.create(template=<snapshot id>)` would: its own session decided afresh by the policy
//! (`request.from_snapshot`), its own grant on a fresh socket, sharing nothing writable with
//! its siblings or its parent. Each fork succeeds or fails on its own (E2B's
//! `SandboxForkResult`: a sandbox or `{code, message}`; a fork held for review is E2B's 503 "not
//! ready yet" naming its approval). The snapshot is deleted once the forks started, unless one
//! of them waits for review (its approval restores it from there).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::api_caller;
use super::control::{held, open_sandbox, optional_body, start_new, Started};
use super::error::E2bError;
use super::live::Live;
use super::wire::{ErrorBody, ForkRequest, ForkResult, NewSandbox, MAX_FORKS};
use crate::app::App;
use crate::audit::ApiKey;
use crate::session_wire::SessionStatus;

/// A fork's lifetime when the call names none (E2B's API default).
const DEFAULT_FORK_TIMEOUT_S: u64 = 15;

pub async fn fork(
    State(app): State<Arc<App>>,
    Extension(live): Extension<Arc<Live>>,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: ForkRequest = optional_body(&body)?;
    let count = request.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("count must be between 1 and {MAX_FORKS}, not {count}"),
        ));
    }
    let (e2b, session) = open_sandbox(&app, &key, &id).await?;
    if session.is(SessionStatus::PendingApproval) {
        return Err(held(&session));
    }
    let snapshot = app.create_snapshot(&key, &id).await?;
    let asked = NewSandbox {
        template_id: snapshot.id.clone(),
        timeout: Some(request.timeout.unwrap_or(DEFAULT_FORK_TIMEOUT_S)),
        metadata: Some(e2b.metadata.0.clone()),
        // The parent's default environment, as its commands get it.
        env_vars: live.get(&id).map(|parent| parent.envs.clone()),
        allow_internet_access: e2b.allow_internet_access,
        ..NewSandbox::default()
    };
    let mut results = Vec::new();
    let mut waiting = false;
    for _ in 0..count {
        let (result, held) = start_one(&app, &live, &key, &asked).await;
        waiting |= held;
        results.push(result);
    }
    if !waiting {
        if let Err(err) = app.delete_snapshot(&key, &snapshot.id).await {
            tracing::warn!(snapshot_id = %snapshot.id, error = %err, "a fork's snapshot was not deleted");
        }
    }
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

/// One fork: its result, and whether it waits for review.
async fn start_one(
    app: &Arc<App>,
    live: &Arc<Live>,
    key: &ApiKey,
    asked: &NewSandbox,
) -> (ForkResult, bool) {
    let failed = |err: E2bError| ForkResult {
        sandbox: None,
        error: Some(ErrorBody {
            code: err.status.as_u16(),
            message: err.message,
        }),
    };
    match start_new(app, live, key.clone(), asked).await {
        Ok(Started::Running(sandbox)) => (
            ForkResult {
                sandbox: Some(sandbox),
                error: None,
            },
            false,
        ),
        Ok(Started::Held(refusal)) => (failed(refusal), true),
        Err(err) => (failed(err), false),
    }
}
