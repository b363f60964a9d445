//! `POST /v1/keys` (admin) `{"role", "tenant", "principal"?}`: a new API key, shown once in the
//! answer; only its hash is stored, and its creation is an audit event (`key.create`).

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::error::ApiError;
use super::json::ApiJson;
use crate::app::App;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    role: String,
    tenant: String,
    /// The person or system behind the key (default: the key's own id); keys of one principal
    /// are one party when approving.
    principal: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/keys",
    tag = "keys",
    operation_id = "keys_create",
    summary = "A new API key, shown once.",
    security(("bearer" = ["admin"])),
    request_body = serde_json::Value,
    responses(
        (status = 201, description = "the key", body = serde_json::Value),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require_role(&["admin"])?;
    // The body is read only for a caller who may call the route.
    let ApiJson(request) = ApiJson::<CreateKey>::from_request(body, &app).await?;
    let principal = request.principal.as_deref();
    let key = app
        .create_key(&caller.0, &request.role, &request.tenant, principal)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": key.id,
            "key": key.secret,
            "role": request.role,
            "tenant": request.tenant,
            "principal": principal.unwrap_or(&key.id),
        })),
    ))
}
