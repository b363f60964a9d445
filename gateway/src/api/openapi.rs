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
        super::snapshots::pause,
        super::snapshots::resume,
        super::snapshots::create,
        super::snapshots::list,
        super::snapshots::get,
        super::snapshots::delete,
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

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Every `$ref` in `value`.
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    out.push(target);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    /// A typed answer names its schema by reference: each one must be in `components`.
    #[test]
    fn every_reference_resolves() {
        let document: Value = serde_json::from_str(super::json()).unwrap();
        let mut found = Vec::new();
        refs(&document, &mut found);
        let missing: Vec<&&str> = found
            .iter()
            .filter(|target| {
                let name = target.trim_start_matches("#/components/schemas/");
                document["components"]["schemas"][name].is_null()
            })
            .collect();
        assert!(missing.is_empty(), "unresolved: {missing:?}");
    }

    /// Every answer with a 2xx body describes it: the free-form `serde_json::Value` is left only
    /// where the body is free-form by nature (the document itself, a JSON-RPC answer).
    #[test]
    fn successful_answers_are_typed() {
        let document: Value = serde_json::from_str(super::json()).unwrap();
        let free_form = ["/v1/openapi.json", "/mcp"];
        let mut untyped = Vec::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                let Some(responses) = operation["responses"].as_object() else {
                    continue;
                };
                for (status, response) in responses {
                    let schema = &response["content"]["application/json"]["schema"];
                    let is_free = schema.is_object() && schema.as_object().unwrap().is_empty();
                    if status.starts_with('2') && is_free && !free_form.contains(&path.as_str()) {
                        untyped.push(format!("{method} {path} {status}"));
                    }
                }
            }
        }
        assert!(untyped.is_empty(), "untyped answers: {untyped:?}");
    }
}
