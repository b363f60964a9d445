//! Every route, called as every role and with no key, against `routes.table`: the access rules
//! of the API in one reviewed file. A route the router serves without a row in the table (or a
//! row without a route) fails this test, and so does any cell that differs.

use crate::common;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use common::TestGateway;

const TABLE: &str = include_str!("../routes.table");
/// The callers, in the table's column order.
const CALLERS: [&str; 5] = ["anonymous", "agent", "reviewer", "auditor", "admin"];
/// Stands for `{id}` (and any other path parameter): nobody's execution.
const MADE_UP_ID: &str = "ex_00000000000000000000000000000000";

type Rows = BTreeMap<(String, String), Vec<String>>;

fn parse_table() -> Rows {
    let mut rows = Rows::new();
    for (number, line) in TABLE.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            fields.len(),
            2 + CALLERS.len(),
            "routes.table line {}: want METHOD PATH and {} outcomes: {line}",
            number + 1,
            CALLERS.len()
        );
        for outcome in &fields[2..] {
            assert!(
                ["allow", "401", "403"].contains(outcome),
                "routes.table line {}: unknown outcome {outcome}",
                number + 1
            );
        }
        let key = (fields[0].to_owned(), fields[1].to_owned());
        let outcomes = fields[2..].iter().map(|s| (*s).to_owned()).collect();
        assert!(
            rows.insert(key, outcomes).is_none(),
            "routes.table line {}: duplicate row",
            number + 1
        );
    }
    rows
}

/// The router's own list.
fn served_routes() -> Vec<(String, String)> {
    gateway::api::routes()
        .iter()
        .map(|route| (route.method.to_string(), route.path.to_owned()))
        .collect()
}

/// A request that gets past body validation, so the answer is about who is asking.
fn body_for(method: &str, path: &str) -> Option<Value> {
    match (method, path) {
        // A language the policy refuses: authorised callers get 403 policy_denied, nothing runs.
        ("POST", "/v1/executions") => Some(json!({"language": "cobol", "code": "x"})),
        ("POST", "/v1/policy/evaluate") => Some(json!({"input": {}})),
        ("POST", "/v1/keys") => Some(json!({"role": "agent", "tenant": "acme"})),
        ("POST", "/v1/approvals/{id}") => Some(json!({"decision": "approve"})),
        ("POST", _) => Some(json!({})),
        _ => None,
    }
}

/// `{id}`, `{path}`, ... replaced by a made-up value.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|segment| {
            if segment.starts_with('{') {
                MADE_UP_ID
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The outcome class of one call, and what was seen (for the diff).
async fn call(gw: &TestGateway, key: Option<&str>, method: &str, path: &str) -> (String, String) {
    let url = format!("{}{}", gw.url, concrete(path));
    let mut request = gw.http.request(method.parse().unwrap(), &url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body_for(method, path) {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
    let class = match (status, code.as_str()) {
        (401, _) => "401",
        (403, "policy_denied") => "allow",
        (403, _) => "403",
        // A server error is never an answer the table can expect.
        (500..=599, _) => "5xx",
        _ => "allow",
    };
    let seen = if code.is_empty() {
        status.to_string()
    } else {
        format!("{status} {code}")
    };
    (class.to_owned(), seen)
}

/// Rows in the table's own layout, ready to paste.
fn render(rows: &Rows) -> String {
    let mut out = format!("# {:<7} {:<36}", "METHOD", "PATH");
    for caller in CALLERS {
        let _ = write!(out, " {caller:<9}");
    }
    for ((method, path), outcomes) in rows {
        let _ = write!(out, "\n{method:<9} {path:<36}");
        for outcome in outcomes {
            let _ = write!(out, " {outcome:<9}");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_answers_every_role_as_the_table_says() {
    let expected = parse_table();
    let served = served_routes();

    let mut problems = Vec::new();
    for route in &served {
        if !expected.contains_key(route) {
            problems.push(format!(
                "+ {} {}: served but has no row in routes.table",
                route.0, route.1
            ));
        }
    }
    for route in expected.keys() {
        if !served.contains(route) {
            problems.push(format!(
                "- {} {}: in routes.table but not served",
                route.0, route.1
            ));
        }
    }

    // Every route is called anonymously (one refusal each): more than the default per-source
    // budget, which is not what this test is about.
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| config.refusals.per_source = 1000).await;
    let mut keys = BTreeMap::new();
    keys.insert("agent", gw.key("agent", "acme").await);
    keys.insert("reviewer", gw.key("reviewer", "acme").await);
    keys.insert("auditor", gw.key("auditor", "audit").await);
    keys.insert("admin", gw.key("admin", "ops").await);

    let mut actual = Rows::new();
    for (method, path) in &served {
        let mut outcomes = Vec::new();
        for (column, caller) in CALLERS.iter().enumerate() {
            let (class, seen) = call(&gw, keys.get(caller).map(String::as_str), method, path).await;
            if let Some(want) = expected.get(&(method.clone(), path.clone())) {
                if want[column] != class {
                    problems.push(format!(
                        "! {method} {path} as {caller}: table says {}, got {class} ({seen})",
                        want[column]
                    ));
                }
            }
            outcomes.push(class);
        }
        actual.insert((method.clone(), path.clone()), outcomes);
    }
    gw.stop().await;

    assert!(
        problems.is_empty(),
        "routes.table does not match the gateway:\n{}\n\nwhat the gateway does:\n{}",
        problems.join("\n"),
        render(&actual)
    );
}
