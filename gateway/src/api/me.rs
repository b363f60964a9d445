//! `GET /v1/me`: who the key is (id, role, tenant, principal), so a client such as the review
//! page can show only what the role may do. Every role may ask; it reveals nothing the caller
//! did not already hold.

use axum::Json;
use serde::Serialize;

use super::auth::Caller;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Me {
    pub key_id: String,
    pub role: crate::role::Role,
    pub tenant: String,
    pub principal: String,
}

#[utoipa::path(
    get,
    path = "/v1/me",
    tag = "keys",
    operation_id = "me",
    summary = "The calling key: id, role, tenant, principal.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    responses(
        (status = 200, description = "the key", body = Me),
        super::openapi::ApiErrors,
    ),
)]
pub async fn me(caller: Caller) -> Json<Me> {
    let key = caller.0;
    Json(Me {
        key_id: key.id,
        role: key.role,
        tenant: key.tenant,
        principal: key.principal,
    })
}
