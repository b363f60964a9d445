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
use crate::app::policy::ReloadError;
use crate::app::refusals::bounded_json;
use crate::app::App;
use crate::audit::NewEvent;

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
    caller.require_role(&["admin", "reviewer", "auditor"])?;
    let active = app.policy.current();
    Ok(Json(json!({
        "revision": active.state.revision(),
        "files": active.state.files(),
        "loaded_by": active.loaded_by,
        "loaded_at": active.loaded_at,
        "error": active.state.error(),
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
    caller.require_role(&["admin", "reviewer"])?;
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
        kind: "policy.evaluate",
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

#[utoipa::path(
    post,
    path = "/v1/policy/reload",
    tag = "policy",
    operation_id = "policy_reload",
    summary = "Reload the policy directory.",
    security(("bearer" = ["admin"])),
    responses(
        (status = 200, description = "accepted or kept the last good bundle", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn reload(State(app): State<Arc<App>>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require_role(&["admin"])?;
    match app.policy.reload(&app.audit, &caller.0.id).await {
        Ok(accepted) => {
            // Every other replica on the database loads its policy directory too.
            app.announce_policy(&accepted.revision).await;
            Ok(Json(json!({
            "accepted": true,
            "revision": accepted.revision,
            "previous": accepted.previous,
            "changed": accepted.revision != accepted.previous,
            })))
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
