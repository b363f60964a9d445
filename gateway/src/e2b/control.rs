//! E2B's control plane: create, list, get, kill, timeout, refresh and connect a sandbox, each
//! one a call of `app` on the sandbox's session (its policy decision, visibility and audit
//! stay sandgate's own), answered in E2B's JSON (`wire`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use rand::RngCore;
use sqlx::types::Json as DbJson;

use super::api_caller;
use super::error::E2bError;
use super::live::{Live, LiveSandbox};
use super::wire::{
    ConnectRequest, ListQuery, NewSandbox, PauseRequest, RefreshRequest, Sandbox, SandboxDetail,
    SandboxState, SnapshotInfo, SnapshotRequest, TimeoutRequest, ENVD_VERSION,
};
use crate::app::sessions::{Opened, SessionRequest};
use crate::app::App;
use crate::audit::e2b_sandboxes::E2bSandboxRow;
use crate::audit::sessions::SessionRow;
use crate::audit::ApiKey;
use crate::session_wire::SessionStatus;
use policy_engine::{E2bInput, Reason};

/// E2B's SDKs' default sandbox timeout, for a create that names none.
const DEFAULT_TIMEOUT_S: u64 = 300;
/// `refreshes` without a `duration`.
const DEFAULT_REFRESH_S: u64 = 60;
/// Most sandboxes in one page of `GET /v2/sandboxes`.
const MAX_PAGE: usize = 100;

type LiveState = Extension<Arc<Live>>;

pub async fn create(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: NewSandbox = json_body(&body)?;
    match start_new(&app, &live, key, &request).await? {
        Started::Running(answer) => Ok((StatusCode::CREATED, Json(answer)).into_response()),
        Started::Held(refusal) => Err(refusal),
    }
}

/// What a create (or one fork) became: a running sandbox, or one held for review (its E2B
/// row recorded, the refusal E2B's "not ready yet").
pub(super) enum Started {
    Running(Sandbox),
    Held(E2bError),
}

/// A new sandbox as `request` asks: its session decided through the pipeline, opened (or
/// held), and its E2B side recorded.
pub(super) async fn start_new(
    app: &Arc<App>,
    live: &Arc<Live>,
    key: ApiKey,
    request: &NewSandbox,
) -> Result<Started, E2bError> {
    let unsupported = request.unsupported();
    if !unsupported.is_empty() {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "sandgate does not support {} on E2B sandboxes (docs/e2b.md)",
                unsupported.join(", ")
            ),
        ));
    }
    let (language, from_snapshot) = template_language(app, &key, &request.template_id).await?;
    let ceilings = &app.config.ceilings;
    let timeout = request
        .timeout
        .unwrap_or(DEFAULT_TIMEOUT_S)
        .clamp(1, ceilings.session_ttl_s.max(1));
    let session = SessionRequest {
        language,
        labels: request.metadata.clone().unwrap_or_default(),
        // The E2B timeout (`live`, `watch`) ends the sandbox; the session's own limits are
        // the ceilings, so they never end it first unless the ceilings are lower.
        idle_timeout_s: Some(ceilings.session_idle_s),
        ttl_s: Some(ceilings.session_ttl_s),
        e2b: Some(E2bInput {
            template: Some(request.template_id.clone()),
            allow_internet_access: request.allow_internet_access,
            call: None,
            context: None,
        }),
        from_snapshot,
        ..SessionRequest::default()
    };
    match app.create_session(&key, session).await? {
        Opened::Ready(row) => opened(app, live, key, request, &row, timeout)
            .await
            .map(Started::Running),
        Opened::PendingApproval(row) => {
            opened(app, live, key, request, &row, timeout).await?;
            Ok(Started::Held(held(&row)))
        }
        Opened::Denied(decision) => Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the policy denied this sandbox: {}",
                reasons_text(&decision.reasons)
            ),
        )),
    }
}

/// Records the E2B side of a session just opened (or held): its row with the token's hash,
/// its envs and end in memory, the watcher of its end; answers with the token.
async fn opened(
    app: &Arc<App>,
    live: &Arc<Live>,
    key: ApiKey,
    request: &NewSandbox,
    row: &SessionRow,
    timeout: u64,
) -> Result<Sandbox, E2bError> {
    if request.allow_internet_access == Some(false) && grants_network(row) {
        // `false` means no network, whatever the policy granted.
        app.delete_session(&key, &row.id).await?;
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            "allow_internet_access is false but the policy granted network access to this \
             sandbox; it was closed (ask for none, or change the policy)",
        ));
    }
    let end_at = capped_end(row, Utc::now() + seconds(timeout));
    let e2b = E2bSandboxRow {
        session_id: row.id.clone(),
        tenant: key.tenant.clone(),
        key_id: key.id.clone(),
        template: request.template_id.clone(),
        metadata: DbJson(request.metadata.clone().unwrap_or_default()),
        allow_internet_access: request.allow_internet_access,
        end_at,
        created_at: Utc::now(),
    };
    let token = new_token();
    if let Err(err) = app.audit.insert_e2b_sandbox(&e2b, &token).await {
        let _ = app.delete_session(&key, &row.id).await;
        return Err(crate::app::AppError::from(err).into());
    }
    let envs = request.env_vars.clone().unwrap_or_default();
    let sandbox = live.insert(&row.id, LiveSandbox::new(key, envs, end_at));
    watch(app, live, row.id.clone(), sandbox);
    Ok(sandbox_answer(&e2b, token))
}

/// A create or connect held for review: E2B's "not ready yet" (503), never retried by the SDK.
pub(super) fn held(row: &SessionRow) -> E2bError {
    let reasons = row
        .decision
        .0
        .get("reasons")
        .and_then(|r| serde_json::from_value::<Vec<Reason>>(r.clone()).ok())
        .unwrap_or_default();
    E2bError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "sandbox {id} is not ready: held for human review (approval {approval}): {why}; \
             once a reviewer approves it, Sandbox.connect(\"{id}\") reaches it",
            id = row.id,
            approval = row.approval_id.as_deref().unwrap_or("-"),
            why = reasons_text(&reasons),
        ),
    )
}

/// Ends the sandbox when its E2B end of life passes (moved by `timeout`, `refreshes`,
/// `connect`): its session is closed like a `DELETE`, by its owner's key.
fn watch(app: &Arc<App>, live: &Arc<Live>, id: String, sandbox: Arc<LiveSandbox>) {
    let (app, live) = (Arc::clone(app), Arc::clone(live));
    let spawned = Arc::clone(&app);
    spawned.tasks.spawn(async move {
        loop {
            let end = sandbox.end_at();
            let wait = (end - Utc::now()).to_std().unwrap_or_default();
            let changed = sandbox.end_changed.notified();
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = changed => continue,
                () = app.shutdown.cancelled() => return,
            }
            if sandbox.end_at() != end {
                continue;
            }
            if let Err(err) = app.delete_session(&sandbox.key, &id).await {
                tracing::warn!(sandbox_id = %id, error = %err, "ending an E2B sandbox at its timeout failed");
            }
            live.remove(&id);
            return;
        }
    });
}

pub async fn list(State(app): State<Arc<App>>, parts: Parts) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let query = Query::<ListQuery>::try_from_uri(&parts.uri)
        .map_err(|err| E2bError::new(StatusCode::BAD_REQUEST, err.body_text()))?
        .0;
    let wanted = query_metadata(query.metadata.as_deref());
    let states = query_states(query.state.as_deref())?;
    let all: Vec<SandboxDetail> = listed(&app, &key)
        .await?
        .into_iter()
        .filter(|d| states.contains(&d.state))
        .filter(|d| wanted.iter().all(|(k, v)| d.metadata.get(k) == Some(v)))
        .collect();
    let offset = match query.next_token.as_deref() {
        Some(token) => token.parse::<usize>().map_err(|_| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                "nextToken is not one this API handed out",
            )
        })?,
        None => 0,
    };
    let limit = query.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let page: Vec<&SandboxDetail> = all.iter().skip(offset).take(limit).collect();
    let mut response = Json(&page).into_response();
    if offset + page.len() < all.len() {
        if let Ok(next) = (offset + page.len()).to_string().parse() {
            response.headers_mut().insert("x-next-token", next);
        }
    }
    Ok(response)
}

/// `GET /sandboxes` (v1): every running one, no paging.
pub async fn list_all(State(app): State<Arc<App>>, parts: Parts) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let all = listed(&app, &key).await?;
    Ok(Json(all).into_response())
}

/// The caller's open E2B sandboxes (those of its sessions it may see), newest first.
async fn listed(app: &App, key: &ApiKey) -> Result<Vec<SandboxDetail>, E2bError> {
    let sessions: BTreeMap<String, SessionRow> = app
        .list_sessions(key)
        .await?
        .into_iter()
        .filter(|row| !row.is(SessionStatus::Closed))
        .map(|row| (row.id.clone(), row))
        .collect();
    let rows = app
        .audit
        .e2b_sandboxes(&key.tenant)
        .await
        .map_err(crate::app::AppError::from)?;
    Ok(rows
        .iter()
        .filter_map(|e2b| sessions.get(&e2b.session_id).map(|s| detail(e2b, s)))
        .collect())
}

pub async fn info(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let (e2b, session) = open_sandbox(&app, &key, &id).await?;
    let mut detail = detail(&e2b, &session);
    if let Some(sandbox) = live.get(&id) {
        detail.end_at = sandbox.end_at();
    }
    Ok(Json(detail).into_response())
}

pub async fn kill(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    open_sandbox(&app, &key, &id).await?;
    app.delete_session(&key, &id).await?;
    live.remove(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn set_timeout(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: TimeoutRequest = json_body(&body)?;
    let (_, session) = open_sandbox(&app, &key, &id).await?;
    let end = capped_end(&session, Utc::now() + seconds(request.timeout));
    move_end(&app, &live, &key, &id, end).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn refresh(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: RefreshRequest = optional_body(&body)?;
    let (e2b, session) = open_sandbox(&app, &key, &id).await?;
    let duration = request.duration.unwrap_or(DEFAULT_REFRESH_S);
    let end = later_end(&live, &e2b, &session, duration);
    move_end(&app, &live, &key, &id, end).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/connect`, `/v2/...` (the SDK's `Sandbox.connect(id)`): a paused
/// sandbox is resumed first (sandgate's resume: the checkpoint restored, 201), a running one
/// answered as it is (200); either way its end moves to at least `timeout` from now and a new
/// envd token is handed out.
pub async fn connect(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: ConnectRequest = optional_body(&body)?;
    let (e2b, session) = open_sandbox(&app, &key, &id).await?;
    let resumed = resume_for(&app, &key, &session, &request).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    reconnected(&app, &live, &key, (&e2b, &session), &request, resumed)
        .await
        .map(|answer| (status, answer).into_response())
}

/// `POST /sandboxes/{id}/resume` (the SDKs' older resume): a paused sandbox resumed (201); a
/// running one is 409, as E2B answers.
pub async fn resume(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: ConnectRequest = optional_body(&body)?;
    let (e2b, session) = open_sandbox(&app, &key, &id).await?;
    if !session.is(SessionStatus::Paused) && !session.is(SessionStatus::PendingApproval) {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is not paused: it is already running"),
        ));
    }
    let resumed = resume_for(&app, &key, &session, &request).await?;
    reconnected(&app, &live, &key, (&e2b, &session), &request, resumed)
        .await
        .map(|answer| (StatusCode::CREATED, answer).into_response())
}

/// Resumes the sandbox's session if it is paused; says whether it was. A held one is E2B's
/// "not ready yet"; a resume from the disk only (`memory: false`) is not offered.
async fn resume_for(
    app: &Arc<App>,
    key: &ApiKey,
    session: &SessionRow,
    request: &ConnectRequest,
) -> Result<bool, E2bError> {
    if session.is(SessionStatus::PendingApproval) {
        return Err(held(session));
    }
    if request.memory == Some(false) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "sandgate resumes a paused sandbox with its memory only (on_resume \"reboot\" is \
             not supported; docs/e2b.md)",
        ));
    }
    if !session.is(SessionStatus::Paused) {
        return Ok(false);
    }
    app.resume_session(key, &session.id).await?;
    Ok(true)
}

/// The answer of a connect or resume: the sandbox's end moved (a resumed one's to `timeout`
/// from now, a running one's to at least that) and a new envd token.
async fn reconnected(
    app: &Arc<App>,
    live: &Arc<Live>,
    key: &ApiKey,
    (e2b, session): (&E2bSandboxRow, &SessionRow),
    request: &ConnectRequest,
    resumed: bool,
) -> Result<Json<Sandbox>, E2bError> {
    let timeout = request.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    let end = if resumed {
        capped_end(session, Utc::now() + seconds(timeout))
    } else {
        later_end(live, e2b, session, timeout)
    };
    move_end(app, live, key, &session.id, end).await?;
    let token = new_token();
    app.audit
        .add_e2b_token(&session.id, &token)
        .await
        .map_err(crate::app::AppError::from)?;
    Ok(Json(sandbox_answer(e2b, token)))
}

/// The sandbox's end moved to at least `secs` from now, never earlier than it is, within the
/// session's lifetime (what refresh and connect share).
fn later_end(live: &Live, e2b: &E2bSandboxRow, session: &SessionRow, secs: u64) -> DateTime<Utc> {
    let current = live.get(&session.id).map_or(e2b.end_at, |s| s.end_at());
    capped_end(session, current.max(Utc::now() + seconds(secs)))
}

/// Refuses E2B's filesystem-only mode (`memory: false`): sandgate `does` a sandbox with its
/// memory only.
fn memory_only(memory: Option<bool>, does: &str) -> Result<(), E2bError> {
    if memory == Some(false) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "sandgate {does} a sandbox with its memory only (mode \"filesystem\" is not \
                 supported; docs/e2b.md)"
            ),
        ));
    }
    Ok(())
}

/// `POST /sandboxes/{id}/pause` (the SDK's `pause()`): sandgate's pause of the session (its
/// sandbox checkpointed, no container left); 409 when already paused, as E2B answers. A paused
/// sandbox waits for its connect: its end moves to the session's own end.
pub async fn pause(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: PauseRequest = optional_body(&body)?;
    memory_only(request.memory, "pauses")?;
    let (_, session) = open_sandbox(&app, &key, &id).await?;
    if session.is(SessionStatus::PendingApproval) {
        return Err(held(&session));
    }
    if session.is(SessionStatus::Paused) {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    app.pause_session(&key, &id).await?;
    move_end(&app, &live, &key, &id, session.expires_at).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/snapshots` (the SDK's `create_snapshot()`): a kept sandgate snapshot
/// of the session (which goes on); its id, given as a create's `templateID`, starts a new
/// sandbox from it (a fork, decided afresh by the policy).
pub async fn snapshot(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = api_caller(&app, &parts).await?;
    let request: SnapshotRequest = optional_body(&body)?;
    memory_only(request.memory, "snapshots")?;
    open_sandbox(&app, &key, &id).await?;
    let snapshot = app.create_snapshot(&key, &id).await?;
    let answer = SnapshotInfo {
        names: vec![snapshot.id.clone()],
        snapshot_id: snapshot.id,
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Metrics, logs, network updates: not built (501).
pub async fn unsupported(Path((id, action)): Path<(String, String)>) -> E2bError {
    E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "POST /sandboxes/{id}/{action} is not supported by sandgate's E2B API \
             (metrics, logs and network updates are not built; docs/e2b.md)"
        ),
    )
}

pub async fn no_such_route(parts: Parts) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!(
            "{} {} is not part of sandgate's E2B API (docs/e2b.md lists what is)",
            parts.method,
            parts.uri.path()
        ),
    )
}

/// Moves the sandbox's end (stored and in memory), watching it when this gateway did not yet.
async fn move_end(
    app: &Arc<App>,
    live: &Arc<Live>,
    key: &ApiKey,
    id: &str,
    end: DateTime<Utc>,
) -> Result<(), E2bError> {
    app.audit
        .set_e2b_end(id, end)
        .await
        .map_err(crate::app::AppError::from)?;
    match live.get(id) {
        Some(sandbox) => sandbox.set_end_at(end),
        None => {
            let sandbox = live.insert(id, LiveSandbox::new(key.clone(), BTreeMap::new(), end));
            watch(app, live, id.to_owned(), sandbox);
        }
    }
    Ok(())
}

/// The caller's E2B sandbox `id`, not closed: else 404 (another tenant's too, audited as a
/// probe by `App::get_session`).
pub(super) async fn open_sandbox(
    app: &App,
    key: &ApiKey,
    id: &str,
) -> Result<(E2bSandboxRow, SessionRow), E2bError> {
    let session = match app.get_session(key, id).await {
        Ok(session) => session,
        Err(crate::app::AppError::NotFound) => return Err(E2bError::not_found(id)),
        Err(err) => return Err(err.into()),
    };
    let e2b = app
        .audit
        .e2b_sandbox(id)
        .await
        .map_err(crate::app::AppError::from)?;
    match e2b {
        Some(e2b) if !session.is(SessionStatus::Closed) => Ok((e2b, session)),
        _ => Err(E2bError::not_found(id)),
    }
}

fn detail(e2b: &E2bSandboxRow, session: &SessionRow) -> SandboxDetail {
    let limit = |name: &str| {
        session
            .limits
            .0
            .get(name)
            .and_then(serde_json::Value::as_f64)
    };
    let state = if session.is(SessionStatus::PendingApproval) || session.is(SessionStatus::Paused) {
        SandboxState::Paused
    } else {
        SandboxState::Running
    };
    SandboxDetail {
        template_id: e2b.template.clone(),
        sandbox_id: e2b.session_id.clone(),
        client_id: CLIENT_ID.to_owned(),
        started_at: session.created_at,
        end_at: e2b.end_at,
        envd_version: ENVD_VERSION.to_owned(),
        cpu_count: limit("cpus").map_or(1, |c| c.ceil().max(1.0) as u64),
        memory_mb: limit("memory_mb").map_or(0, |m| m as u64),
        disk_size_mb: limit("disk_mb").map_or(0, |d| d as u64),
        state,
        metadata: e2b.metadata.0.clone(),
        allow_internet_access: e2b.allow_internet_access,
    }
}

/// E2B's legacy `clientID`: the SDKs require the field and ignore its value.
const CLIENT_ID: &str = "sandgate";

fn sandbox_answer(e2b: &E2bSandboxRow, token: String) -> Sandbox {
    Sandbox {
        template_id: e2b.template.clone(),
        sandbox_id: e2b.session_id.clone(),
        client_id: CLIENT_ID.to_owned(),
        envd_version: ENVD_VERSION.to_owned(),
        traffic_access_token: token.clone(),
        envd_access_token: token,
        domain: None,
    }
}

/// A template id that names a kept snapshot (`sn_...`, from `POST /sandboxes/{id}/snapshots`):
/// the new sandbox is restored from it, in its language.
async fn template_language(
    app: &App,
    key: &ApiKey,
    template: &str,
) -> Result<(String, Option<String>), E2bError> {
    if template.starts_with("sn_") {
        return match app.get_snapshot(key, template).await {
            Ok(snapshot) => Ok((snapshot.language, Some(snapshot.id))),
            Err(crate::app::AppError::NotFound) => Err(E2bError::new(
                StatusCode::NOT_FOUND,
                format!("snapshot {template} not found"),
            )),
            Err(err) => Err(err.into()),
        };
    }
    configured_language(app, template).map(|language| (language, None))
}

/// The session language of a configured template, or 404 naming the configured ones.
fn configured_language(app: &App, template: &str) -> Result<String, E2bError> {
    let templates = &app.config.e2b.templates;
    templates
        .get(template)
        .map(|t| t.language.clone())
        .ok_or_else(|| {
            let known: Vec<&str> = templates.keys().map(String::as_str).collect();
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "template {template:?} is not configured on this gateway (configured: {})",
                    known.join(", ")
                ),
            )
        })
}

fn grants_network(row: &SessionRow) -> bool {
    row.decision
        .0
        .get("network")
        .is_some_and(|network| !network.is_null())
}

/// Never past the session's own end of life (the ceilings').
fn capped_end(session: &SessionRow, end: DateTime<Utc>) -> DateTime<Utc> {
    end.min(session.expires_at.max(session.created_at))
        .max(Utc::now())
}

fn seconds(s: u64) -> chrono::Duration {
    chrono::Duration::seconds(
        i64::try_from(s)
            .unwrap_or(i64::MAX / 1000)
            .min(10 * 365 * 86_400),
    )
}

/// A new envd access token: 32 random bytes, hex. Only its hash is stored; it is never logged.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("sge2b_{}", hex::encode(bytes))
}

pub(super) fn reasons_text(reasons: &[Reason]) -> String {
    if reasons.is_empty() {
        return "no reason given".to_owned();
    }
    reasons
        .iter()
        .map(|r| format!("{}: {}", r.code, r.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A body the SDKs may leave empty.
pub(super) fn optional_body<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, E2bError> {
    if body.is_empty() {
        return Ok(T::default());
    }
    json_body(body)
}

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, E2bError> {
    serde_json::from_slice(body).map_err(|err| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid: {err}"),
        )
    })
}

/// The `metadata` filter: `k=v&k2=v2`, each part percent-encoded once more by the SDKs.
fn query_metadata(text: Option<&str>) -> Vec<(String, String)> {
    let Some(text) = text else {
        return Vec::new();
    };
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| percent_decode(&percent_decode(&s.replace('+', " ")));
            (decode(k), decode(v))
        })
        .collect()
}

fn query_states(text: Option<&str>) -> Result<Vec<SandboxState>, E2bError> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(vec![SandboxState::Running, SandboxState::Paused]);
    };
    text.split(',')
        .map(|s| {
            SandboxState::parse(s.trim()).ok_or_else(|| {
                E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("state {s:?} is not one of running, paused"),
                )
            })
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_decode_as_the_sdks_encode_them() {
        // Python: urlencode({quote(k): quote(v)}) for {"user id": "a/b"}.
        let parsed = query_metadata(Some("user%2520id=a%252Fb&team=x"));
        assert_eq!(
            parsed,
            vec![
                ("user id".to_owned(), "a/b".to_owned()),
                ("team".to_owned(), "x".to_owned())
            ]
        );
    }

    #[test]
    fn states_are_a_closed_set() {
        assert_eq!(
            query_states(Some("running")).unwrap(),
            vec![SandboxState::Running]
        );
        assert!(query_states(Some("running,gone")).is_err());
    }
}
