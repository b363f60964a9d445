//! API keys (admin only):
//! - `POST /v1/keys` `{"role", "tenant", "principal"?, "expires_at"?}`: a new key, shown once
//!   in the answer (only its hash is stored); `tenant_known: false` and a `warnings` entry when
//!   the policy data does not name the tenant;
//! - `GET /v1/keys?tenant=&limit=&before=`: keys, newest first, a page at a time, never a hash;
//! - `DELETE /v1/keys/{id}`: revokes the key; it is refused from the next request on.
//!
//! Every change is an audit event (`key.create`, `key.revoke`).

use std::sync::Arc;

use axum::extract::FromRequest;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::auth::Caller;
use super::error::ApiError;
use super::json::ApiJson;
use super::listing::non_empty;
use super::query::{page_size, ApiQuery};
use crate::app::keys::{check_new_key, unknown_tenant_warning};
use crate::app::{App, AppError};
use crate::audit::keys::{KeyRow, KeyState};
use crate::role::Role;

/// Page size of `GET /v1/keys` when `limit` is absent, and the largest.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 500;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// `agent`, `reviewer`, `auditor` or `admin` (another name is refused with its list).
    role: String,
    tenant: String,
    /// The person or system behind the key (default: the key's own id); keys of one principal
    /// are one party when approving. Stored normalised (NFKC, trimmed, case folded).
    principal: Option<String>,
    /// When the key stops working (RFC 3339); absent: it works until revoked.
    expires_at: Option<DateTime<Utc>>,
}

#[utoipa::path(
    post,
    path = "/v1/keys",
    tag = "keys",
    operation_id = "keys_create",
    summary = "A new API key, shown once.",
    security(("bearer" = ["admin"])),
    request_body = CreateKey,
    responses(
        (status = 201, description = "the key", body = CreatedKey),
        super::openapi::ApiErrors,
    ),
)]
pub async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: axum::extract::Request,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    caller.require_role(&[Role::Admin])?;
    // The body is read only for a caller who may call the route.
    let ApiJson(request) = ApiJson::<CreateKey>::from_request(body, &app).await?;
    let checked = check_new_key(
        &request.role,
        &request.tenant,
        request.principal.as_deref(),
        request.expires_at,
    )
    .map_err(AppError::Invalid)?;
    let created = app.create_key(&caller.0, &checked).await?;
    let warnings: Vec<String> = match created.tenant_known {
        Some(false) => vec![unknown_tenant_warning(&checked.tenant)],
        _ => Vec::new(),
    };
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            expires_at: checked.expires_at,
            id: created.key.id,
            key: created.key.secret,
            principal: created.key.principal,
            role: checked.role,
            tenant: checked.tenant,
            tenant_known: created.tenant_known,
            warnings,
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyQuery {
    tenant: Option<String>,
    limit: Option<u32>,
    /// The id of the last key of the previous page.
    before: Option<String>,
}

#[utoipa::path(
    get,
    path = "/v1/keys",
    tag = "keys",
    operation_id = "keys_list",
    summary = "API keys (never their secrets), newest first, a page at a time.",
    security(("bearer" = ["admin"])),
    params(
        ("tenant" = Option<String>, Query),
        ("limit" = Option<u32>, Query),
        ("before" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "a page of keys, newest first", body = KeyPage),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<KeyQuery>,
) -> Result<Json<KeyPage>, ApiError> {
    caller.require_role(&[Role::Admin])?;
    let limit = page_size(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let tenant = non_empty(query.tenant);
    let before = non_empty(query.before);
    let rows = app
        .list_keys(tenant.as_deref(), before.as_deref(), limit)
        .await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|row| row.id.clone()))
        .flatten();
    let now = Utc::now();
    let keys = rows.iter().map(|row| key_view(row, now)).collect();
    Ok(Json(KeyPage { keys, next_before }))
}

#[utoipa::path(
    delete,
    path = "/v1/keys/{id}",
    tag = "keys",
    operation_id = "keys_revoke",
    summary = "Revokes a key: refused on its next request.",
    security(("bearer" = ["admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "the revoked key", body = KeyView),
        super::openapi::ApiErrors,
    ),
)]
pub async fn revoke(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<KeyView>, ApiError> {
    caller.require_role(&[Role::Admin])?;
    let row = app.revoke_key(&caller.0, &id).await?;
    Ok(Json(key_view(&row, Utc::now())))
}

/// The answer to `POST /v1/keys`: the new key, its secret shown this once. (Fields in the
/// order the answer has always had them: alphabetical.)
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    pub expires_at: Option<DateTime<Utc>>,
    pub id: String,
    /// The secret (`sgk_...`): shown once, never stored.
    pub key: String,
    pub principal: String,
    pub role: Role,
    pub tenant: String,
    /// Whether the active policy data names the tenant (`null`: no bundle is loaded).
    pub tenant_known: Option<bool>,
    pub warnings: Vec<String>,
}

/// A key as the API shows it: never its hash or secret. (Fields alphabetical, as before.)
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub id: String,
    /// When the key last authenticated a request (to the minute).
    pub last_used_at: Option<DateTime<Utc>>,
    pub principal: String,
    pub revoked_at: Option<DateTime<Utc>>,
    pub role: Role,
    pub state: KeyState,
    pub tenant: String,
}

/// `GET /v1/keys`: a page, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyPage {
    pub keys: Vec<KeyView>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<String>,
}

fn key_view(row: &KeyRow, now: DateTime<Utc>) -> KeyView {
    KeyView {
        created_at: row.created_at,
        expires_at: row.expires_at,
        id: row.id.clone(),
        last_used_at: row.last_used_at,
        principal: row.principal.clone(),
        revoked_at: row.revoked_at,
        role: row.role,
        state: row.state(now),
        tenant: row.tenant.clone(),
    }
}
