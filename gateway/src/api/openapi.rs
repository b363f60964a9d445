//! `GET /v1/openapi.json`: the API described as OpenAPI 3.1, generated (utoipa) from the
//! `#[utoipa::path]` attribute on each handler and the types the handlers read and write.
//! Roles are the bearer scheme's scopes (OpenAPI lets non-OAuth schemes list role names there);
//! an empty requirement marks a route open to every caller. `gateway/tests/e2e/openapi.rs` checks
//! that every route of [`super::routes`] is here with the roles `routes.table` gives it.
//!
//! Built once per process and served from memory.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;
use super::{
    approvals, audit, charts, executions, health, keys, listing, mcp, me, metrics, payloads,
    policy, proposals, session_files, sessions, ui,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandgate",
        description = "A policy-centred gateway that runs untrusted code in gVisor sandboxes. \
                       Authenticate with `Authorization: Bearer <key>`; each operation's \
                       `bearer` scopes are the roles that may call it."
    ),
    modifiers(&BearerKeys),
    // Beside the bodies the paths name: the SSE payloads of `/v1/executions/{id}/events` and
    // the audit event kinds, so a generated client has them too.
    components(schemas(
        ErrorBody,
        api_types::OutputEvent,
        api_types::ExitEvent,
        api_types::StreamEventName,
        api_types::EventKind,
    )),
    paths(
        health::healthz,
        health::readyz,
        metrics::scrape,
        document,
        mcp::serve,
        executions::create,
        listing::list,
        executions::get,
        executions::cancel,
        executions::connections,
        sessions::create,
        sessions::list,
        sessions::get,
        sessions::delete,
        sessions::execute,
        session_files::list,
        session_files::stat,
        session_files::read,
        session_files::write,
        session_files::mkdir,
        session_files::rename,
        session_files::remove,
        payloads::events,
        payloads::download,
        approvals::list,
        approvals::get,
        approvals::decide,
        audit::events,
        audit::verify,
        charts::summary,
        policy::show,
        policy::evaluate,
        policy::reload,
        policy::rollback,
        proposals::create,
        proposals::list,
        proposals::get,
        proposals::approve,
        proposals::reject,
        proposals::rebase,
        proposals::access_request,
        keys::create,
        keys::list,
        keys::revoke,
        me::me,
        ui::redirect,
        ui::index,
        ui::asset,
    )
)]
struct ApiDoc;

/// The `bearer` security scheme the operations name.
struct BearerKeys;

impl Modify for BearerKeys {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key from `sandgate keys create`."))
                    .build(),
            ),
        );
    }
}

/// The error answers every authenticated route may give, all as [`ErrorBody`].
pub struct ApiErrors;

impl utoipa::IntoResponses for ApiErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        [
            (400, "invalid_request"),
            (401, "unauthenticated"),
            (403, "forbidden, or policy_denied with the policy's reasons"),
            (404, "not_found"),
            (429, "rate_limited"),
            (503, "unavailable: nothing was run"),
        ]
        .into_iter()
        .map(|(status, description)| {
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", content)
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
    }
}

/// The document as JSON (built on first use).
pub fn json() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .unwrap_or_else(|err| format!("{{\"error\":\"openapi: {err}\"}}"))
    })
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "openapi",
    operation_id = "openapi_document",
    summary = "This document (OpenAPI 3.1).",
    security(()),
    responses(
        (status = 200, description = "the document", body = serde_json::Value),
    ),
)]
pub async fn document() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], json())
}
