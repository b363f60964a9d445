//! `/v1/policy`: what is active, dry-run evaluation, and reload.

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use api_types::CredentialsReload;
use policy_engine::{EgressInput, Reason};

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use crate::app::policy::{Guard, Precondition, ReloadError, Source};
use crate::app::policy_revisions::KeptRevision;
use crate::app::policy_upload::MAX_UPLOAD_BYTES;
use crate::app::refusals::bounded_json;
use crate::app::App;
use crate::audit::events::{self, policy::EntryPoint};
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
        (status = 200, description = "revision and files", body = PolicyView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn show(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<([(axum::http::HeaderName, String); 1], Json<PolicyView>), ApiError> {
    caller.require_role(&[Role::Admin, Role::Reviewer, Role::Auditor])?;
    let active = app.policy.current();
    // The revision as a strong entity tag, for `If-Match` on `POST /v1/policy/reload`.
    let etag = [(
        axum::http::header::ETAG,
        format!("\"{}\"", active.state.revision()),
    )];
    let view = Json(PolicyView {
        error: active.state.error().map(str::to_owned),
        files: active.state.files().to_vec(),
        kept: app.policy.kept(),
        loaded_at: active.loaded_at,
        loaded_by: active.loaded_by.clone(),
        revision: active.state.revision().to_owned(),
    });
    Ok((etag, view))
}

/// `GET /v1/policy`: the active bundle. (Fields alphabetical, as the answer always had them.)
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PolicyView {
    /// Why no bundle is active (the gateway then denies everything), if none is.
    pub error: Option<String>,
    pub files: Vec<String>,
    /// The revisions kept for `POST /v1/policy/rollback`, newest first.
    pub kept: Vec<KeptRevision>,
    pub loaded_at: DateTime<Utc>,
    pub loaded_by: String,
    pub revision: String,
}

/// The answer to `POST /v1/policy/evaluate`. (Fields alphabetical, as before.)
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Evaluation {
    /// The policy's decision as it said it.
    #[schema(value_type = Object)]
    pub decision: Value,
    pub entry_point: EntryPoint,
    pub reasons: Vec<Reason>,
    pub revision: String,
}

/// The body of `POST /v1/policy/evaluate`: an input as the entry point's policy reads it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    #[schema(value_type = Object)]
    input: Value,
    #[serde(default)]
    entry_point: EntryPoint,
}

/// The decision for one input with the active bundle; nothing runs. Recorded like any decision.
#[utoipa::path(
    post,
    path = "/v1/policy/evaluate",
    tag = "policy",
    operation_id = "policy_evaluate",
    summary = "Dry-run decision for one input; nothing runs.",
    security(("bearer" = ["reviewer", "admin"])),
    request_body = EvaluateRequest,
    responses(
        (status = 200, description = "the decision", body = Evaluation),
        super::openapi::ApiErrors,
    ),
)]
pub async fn evaluate(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<Json<Evaluation>, ApiError> {
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
        reasons: events::column(&reasons),
        // Bounded: a large input (or one with NUL) is kept as its size and SHA-256.
        input: events::column(&events::policy::Evaluate {
            entry_point: request.entry_point,
            input: bounded_json(&request.input),
        }),
        decision: decision.clone(),
        policy_revision: Some(active.state.revision().to_owned()),
    };
    app.audit
        .record_event(&event)
        .await
        .map_err(|err| ApiError::from(crate::app::AppError::from(err)))?;
    Ok(Json(Evaluation {
        decision,
        entry_point: request.entry_point,
        reasons,
        revision: active.state.revision().to_owned(),
    }))
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
    description = "With `If-Match: \"<revision>\"` (or `*`, or a list; RFC 9110 strong \
        comparison, so a weak `W/` tag never matches), only while that revision is active on \
        this replica and was the last activated on any replica (else 409 `revision_conflict`, \
        nothing changes, the credentials are not read again). The answer's `credentials` is `{\"reloaded\": N}`, or `{\"error\": ...}` naming \
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
    let guard = Guard {
        if_match: if_match(&body)?,
        proposal: None,
    };
    let reloaded = if is_gzip(&body) {
        if guard.if_match.is_some() {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "If-Match is taken with a reload of a directory, not with an upload",
            ));
        }
        let bytes = axum::body::to_bytes(body.into_body(), MAX_UPLOAD_BYTES)
            .await
            .map_err(|_| {
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("an uploaded bundle must be at most {MAX_UPLOAD_BYTES} bytes"),
                )
            })?;
        let incoming = app.config.data_dir.join("policy-incoming");
        app.policy
            .reload_upload(&app.audit, &caller.0.id, bytes.to_vec(), &incoming)
            .await
    } else {
        let request: ReloadRequest = optional_body(body).await?;
        let source = match request.dir {
            Some(dir) => Source::Dir(dir),
            None => Source::Configured,
        };
        app.policy
            .reload_guarded(&app.audit, &caller.0.id, source, guard)
            .await
    };
    // The credentials' values are read again only once the precondition held: a 409
    // revision_conflict changes nothing at all.
    let credentials = match &reloaded {
        Err(ReloadError::RevisionConflict { .. }) => None,
        _ => Some(match app.reload_credentials(&caller.0.id) {
            None => CredentialsReload::Reloaded { reloaded: 0 },
            Some(Ok(count)) => CredentialsReload::Reloaded { reloaded: count },
            Some(Err(err)) => CredentialsReload::Failed {
                error: crate::errors::error_chain(&err),
            },
        }),
    };
    answer(&app, reloaded, credentials).await
}

/// `If-Match` (RFC 9110, 13.1.1) with revisions as entity tags: `*` (any loaded revision), or
/// a comma-separated list of `"<revision>"` (a bare `<revision>` is taken too); the reload
/// applies only while one of them is active, else 409 `revision_conflict`. A weak tag
/// (`W/"..."`) never matches If-Match (strong comparison), so a list of only weak tags always
/// fails. A tag that is not a revision (`sha256:...`) is refused (400).
fn if_match(body: &axum::extract::Request) -> Result<Option<Precondition>, ApiError> {
    let mut values = body
        .headers()
        .get_all(axum::http::header::IF_MATCH)
        .iter()
        .peekable();
    if values.peek().is_none() {
        return Ok(None);
    }
    let invalid = |why: &str| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("If-Match must be * or a list of \"sha256:...\" revisions: {why}"),
        )
    };
    let mut tags = Vec::new();
    for value in values {
        let text = value.to_str().map_err(|_| invalid("not text"))?;
        for tag in text.split(',').map(str::trim).filter(|tag| !tag.is_empty()) {
            if tag == "*" {
                return Ok(Some(Precondition::Any));
            }
            let (weak, tag) = match tag.strip_prefix("W/") {
                Some(rest) => (true, rest),
                None => (false, tag),
            };
            let tag = tag
                .strip_prefix('"')
                .and_then(|rest| rest.strip_suffix('"'))
                .unwrap_or(tag);
            if !tag.starts_with("sha256:") || tag.contains(['"', ' ']) {
                return Err(invalid(&format!("{tag:?}")));
            }
            if !weak {
                tags.push(tag.to_owned());
            }
        }
    }
    Ok(Some(Precondition::OneOf(tags)))
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
pub(super) async fn optional_body<T: Default + serde::de::DeserializeOwned>(
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
    credentials: Option<CredentialsReload>,
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
        Err(ReloadError::RevisionConflict { message, .. }) => {
            Err(ApiError::new(ErrorCode::RevisionConflict, message))
        }
        Err(ReloadError::Closed(message)) => Err(ApiError::new(ErrorCode::Conflict, message)),
        Err(ReloadError::App(err)) => Err(err.into()),
    }
}
