//! `/v1/policy`: what is active, dry-run evaluation, and reload.

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use policy_engine::{EgressInput, Reason};

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use crate::app::policy::{ReloadError, Source};
use crate::app::policy_upload::MAX_UPLOAD_BYTES;
use crate::app::refusals::bounded_json;
use crate::app::App;
use crate::audit::NewEvent;
use crate::role::Role;

#[utoipa::path(
    get,
    path = "/v1/policy",
    tag = "policy",
    operation_id = "policy_show",
    summary = "The active policy bundle.",
    security(("bearer" = ["reviewer", "auditor", "admin"])),
    responses(
        (status = 200, description = "revision and files", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn show(State(app): State<Arc<App>>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require_role(&[Role::Admin, Role::Reviewer, Role::Auditor])?;
    let active = app.policy.current();
    Ok(Json(json!({
        "revision": active.state.revision(),
        "files": active.state.files(),
        "loaded_by": active.loaded_by,
        "loaded_at": active.loaded_at,
        "error": active.state.error(),
        "kept": app.policy.kept(),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    input: Value,
    #[serde(default)]
    entry_point: EntryPoint,
}

#[derive(Debug, Default, Clone, Copy, Deserialize, serde::Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum EntryPoint {
    #[default]
    Execution,
    Egress,
}

/// The decision for one input with the active bundle; nothing runs. Recorded like any decision.
#[utoipa::path(
    post,
    path = "/v1/policy/evaluate",
    tag = "policy",
    operation_id = "policy_evaluate",
    summary = "Dry-run decision for one input; nothing runs.",
    security(("bearer" = ["reviewer", "admin"])),
    request_body = serde_json::Value,
    responses(
        (status = 200, description = "the decision", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn evaluate(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    caller.require_role(&[Role::Admin, Role::Reviewer])?;
    // The body is read only for a caller who may call the route.
    let ApiJson(request) = ApiJson::<EvaluateRequest>::from_request(body, &app).await?;
    // The policy may echo input into its reasons, which the audit row stores as jsonb (no NUL).
    if request.input.to_string().contains("\\u0000") {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "input must not contain a NUL character",
        ));
    }
    let active = app.policy.current();
    let (decision, allow, reasons): (Value, bool, Vec<Reason>) = match request.entry_point {
        EntryPoint::Execution => {
            let decision = active.state.decide_json(&request.input);
            (json!(decision), decision.allow, decision.reasons)
        }
        EntryPoint::Egress => {
            let input: EgressInput = serde_json::from_value(request.input.clone())
                .map_err(|err| ApiError::new(ErrorCode::InvalidRequest, format!("input: {err}")))?;
            let decision = active.state.decide_egress(&input);
            (json!(decision), decision.allow, decision.reasons)
        }
    };
    let event = NewEvent {
        kind: api_types::EventKind::PolicyEvaluate,
        execution_id: None,
        key_id: Some(caller.0.id.clone()),
        tenant: Some(caller.0.tenant.clone()),
        decision_id: None,
        allow: Some(allow),
        reasons: json!(reasons),
        // Bounded: a large input (or one with NUL) is kept as its size and SHA-256.
        input: json!({"entry_point": request.entry_point, "input": bounded_json(&request.input)}),
        decision: decision.clone(),
        policy_revision: Some(active.state.revision().to_owned()),
    };
    app.audit
        .record_event(&event)
        .await
        .map_err(|err| ApiError::from(crate::app::AppError::from(err)))?;
    Ok(Json(json!({
        "revision": active.state.revision(),
        "entry_point": request.entry_point,
        "decision": decision,
        "reasons": reasons,
    })))
}

/// Most bytes of a reload or rollback body.
const MAX_RELOAD_BODY: usize = 16 * 1024;

/// `POST /v1/policy/reload` body (optional): a candidate directory instead of `policy_dir`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadRequest {
    /// An absolute path of a directory the gateway can read; absent: the configured policy_dir.
    dir: Option<std::path::PathBuf>,
}

/// `POST /v1/policy/rollback` body (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// A kept revision (`sha256:...`, `GET /v1/policy` lists them); absent: the one active
    /// before the current one.
    revision: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/policy/reload",
    tag = "policy",
    operation_id = "policy_reload",
    summary = "Load a candidate bundle: the policy directory again, `{\"dir\": \"/abs/path\"}`, or a gzip'd tar uploaded with content-type application/gzip; the credentials' values are read again.",
    description = "The answer's `credentials` is `{\"reloaded\": N}`, or `{\"error\": ...}` naming \
        the credential whose value could not be read (the previous values then stay).",
    security(("bearer" = ["admin"])),
    request_body(content = serde_json::Value, description = "optional: `{\"dir\": \"/srv/policies-candidate\"}`"),
    responses(
        (status = 200, description = "accepted", body = api_types::PolicyAccepted),
        (status = 409, description = "rejected; the active bundle stays", body = super::error::ErrorBody),
        super::openapi::ApiErrors,
    ),
)]
pub async fn reload(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<Json<api_types::PolicyAccepted>, ApiError> {
    caller.require_role(&[Role::Admin])?;
    let credentials = Some(match app.reload_credentials(&caller.0.id) {
        None => json!({"reloaded": 0}),
        Some(Ok(count)) => json!({"reloaded": count}),
        Some(Err(err)) => json!({"error": crate::errors::error_chain(&err)}),
    });
    if is_gzip(&body) {
        let bytes = axum::body::to_bytes(body.into_body(), MAX_UPLOAD_BYTES)
            .await
            .map_err(|_| {
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("an uploaded bundle must be at most {MAX_UPLOAD_BYTES} bytes"),
                )
            })?;
        let incoming = app.config.data_dir.join("policy-incoming");
        let uploaded = app
            .policy
            .reload_upload(&app.audit, &caller.0.id, bytes.to_vec(), &incoming)
            .await;
        return answer(&app, uploaded, credentials).await;
    }
    let request: ReloadRequest = optional_body(body).await?;
    let source = match request.dir {
        Some(dir) => Source::Dir(dir),
        None => Source::Configured,
    };
    let reloaded = app
        .policy
        .reload_from(&app.audit, &caller.0.id, source)
        .await;
    answer(&app, reloaded, credentials).await
}

#[utoipa::path(
    post,
    path = "/v1/policy/rollback",
    tag = "policy",
    operation_id = "policy_rollback",
    summary = "Activate a kept revision again (default: the one before the current).",
    security(("bearer" = ["admin"])),
    request_body(content = serde_json::Value, description = "optional: `{\"revision\": \"sha256:...\"}`"),
    responses(
        (status = 200, description = "accepted", body = api_types::PolicyAccepted),
        (status = 409, description = "rejected; the active bundle stays", body = super::error::ErrorBody),
        super::openapi::ApiErrors,
    ),
)]
pub async fn rollback(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<Json<api_types::PolicyAccepted>, ApiError> {
    caller.require_role(&[Role::Admin])?;
    let request: RollbackRequest = optional_body(body).await?;
    let source = Source::Revision(request.revision);
    let reloaded = app
        .policy
        .reload_from(&app.audit, &caller.0.id, source)
        .await;
    answer(&app, reloaded, None).await
}

/// `content-type: application/gzip` (or `application/x-gzip`, `application/x-tar+gzip`): an
/// uploaded bundle, a gzip'd tar of the policy directory.
fn is_gzip(body: &axum::extract::Request) -> bool {
    let Some(value) = body.headers().get(axum::http::header::CONTENT_TYPE) else {
        return false;
    };
    let mime = value.to_str().unwrap_or_default();
    let mime = mime.split(';').next().unwrap_or_default().trim();
    [
        "application/gzip",
        "application/x-gzip",
        "application/x-tar+gzip",
    ]
    .iter()
    .any(|known| mime.eq_ignore_ascii_case(known))
}

/// A JSON body that may be absent (empty: the default).
async fn optional_body<T: Default + serde::de::DeserializeOwned>(
    body: axum::extract::Request,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body.into_body(), MAX_RELOAD_BODY)
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the body must be at most {MAX_RELOAD_BODY} bytes"),
            )
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|err| ApiError::new(ErrorCode::InvalidRequest, format!("body: {err}")))
}

/// The answer to a reload or rollback; an accepted one is announced to every other replica on
/// the database (each loads its policy directory too).
async fn answer(
    app: &App,
    result: Result<crate::app::policy::ReloadAccepted, ReloadError>,
    credentials: Option<Value>,
) -> Result<Json<api_types::PolicyAccepted>, ApiError> {
    match result {
        Ok(accepted) => {
            app.announce_policy(&accepted.revision).await;
            Ok(Json(api_types::PolicyAccepted {
                accepted: true,
                changed: accepted.revision != accepted.previous,
                revision: accepted.revision,
                previous: accepted.previous,
                credentials,
            }))
        }
        Err(ReloadError::Rejected {
            message,
            active_revision,
        }) => Err(ApiError {
            code: ErrorCode::Conflict,
            message: format!(
                "the candidate bundle was rejected; revision {active_revision} stays active"
            ),
            reasons: Some(vec![Reason {
                code: "policy.rejected".to_owned(),
                message,
            }]),
            execution_id: None,
            retry_after: None,
        }),
        Err(ReloadError::App(err)) => Err(err.into()),
    }
}
