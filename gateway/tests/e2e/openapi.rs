//! `GET /v1/openapi.json`: served to anyone, valid OpenAPI 3.1 by a real validator
//! (`openapi-spec-validator` from PyPI, in the Python test environment), and complete: every
//! route of `gateway::api::routes()` is in it, with the roles `routes.table` gives that route as
//! its `bearer` scopes (a route added without docs, or documented with other roles, fails here).

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use common::TestGateway;

const TABLE: &str = include_str!("../routes.table");
const ROLES: [&str; 4] = ["agent", "reviewer", "auditor", "admin"];

/// (METHOD, path) -> the roles allowed, or `None` when anonymous callers are allowed too.
fn table() -> BTreeMap<(String, String), Option<Vec<String>>> {
    TABLE
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let roles = if fields[2] == "allow" {
                None
            } else {
                let allowed = ROLES
                    .iter()
                    .zip(&fields[3..])
                    .filter(|(_, outcome)| **outcome == "allow")
                    .map(|(role, _)| (*role).to_owned())
                    .collect();
                Some(allowed)
            };
            ((fields[0].to_owned(), fields[1].to_owned()), roles)
        })
        .collect()
}

/// axum's `{*path}` is OpenAPI's `{path}`.
fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The roles an operation's `security` names; `None` for an open route (`[{}]`).
fn documented_roles(operation: &Value) -> Option<Vec<String>> {
    let security = operation["security"].as_array().expect("security listed");
    if security
        .iter()
        .any(|requirement| requirement == &serde_json::json!({}))
    {
        return None;
    }
    let mut roles: Vec<String> = security
        .iter()
        .flat_map(|requirement| {
            requirement["bearer"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|role| role.as_str().unwrap().to_owned())
        .collect();
    roles.sort_by_key(|role| ROLES.iter().position(|r| r == role));
    Some(roles)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_document_is_open_valid_openapi_31_and_lists_every_route_with_its_roles() {
    let gw = TestGateway::start().await;
    let response = gw
        .http
        .get(format!("{}/v1/openapi.json", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    gw.stop().await;
    let document: Value = serde_json::from_str(&text).unwrap();
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        document["openapi"]
    );

    let table = table();
    let mut problems = Vec::new();
    for route in gateway::api::routes() {
        let method = route.method.as_str().to_lowercase();
        let path = openapi_path(route.path);
        let operation = &document["paths"][&path][&method];
        if operation.is_null() {
            problems.push(format!(
                "{} {}: not in the document",
                route.method, route.path
            ));
            continue;
        }
        let want = &table[&(route.method.to_string(), route.path.to_owned())];
        let documented = documented_roles(operation);
        if &documented != want {
            problems.push(format!(
                "{} {}: documented roles {documented:?}, routes.table says {want:?}",
                route.method, route.path
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let schemas = &document["components"]["schemas"];
    for schema in [
        "ExecutionRequest",
        "ExecutionView",
        "ExecutionPage",
        "ErrorBody",
        "ErrorCode",
        "Reason",
        "ApprovalView",
        "ApprovalStatus",
        "DecidedApproval",
        "SessionView",
        "SessionRequest",
        "SessionExecutionRequest",
        "ExitEvent",
        "OutputEvent",
        "EventKind",
    ] {
        assert!(schemas[schema].is_object(), "schema {schema} missing");
    }
    let statuses: Vec<&str> = schemas["ExecutionStatus"]["enum"]
        .as_array()
        .expect("ExecutionStatus is an enum")
        .iter()
        .map(|status| status.as_str().unwrap())
        .collect();
    let known: Vec<&str> = gateway::status::ExecutionStatus::ALL
        .iter()
        .map(|status| status.as_str())
        .collect();
    assert_eq!(statuses, known);

    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &text).unwrap();
    let validator = common::python_venv().join("bin/openapi-spec-validator");
    let output = Command::new(&validator)
        .arg(file.path())
        .output()
        .unwrap_or_else(|err| {
            panic!(
                "{} not runnable ({err}): run `bash scripts/setup.sh`",
                validator.display()
            )
        });
    assert!(
        output.status.success(),
        "openapi-spec-validator rejected the document:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_document_is_built_once_and_served_from_memory() {
    let first = gateway::api::openapi::json();
    let second = gateway::api::openapi::json();
    assert!(std::ptr::eq(first, second));
}
