//! A session is its opener's (issue 21, item 4): another agent key of the same tenant finds
//! nothing on any session route unless the policy shares the session explicitly
//! (`session.shared`; the shipped policy shares acme's sessions between the keys of one
//! principal). And a session carries its decision like an execution, with an `id` (item 12).
//! Through the real stack: the in-process gateway, PostgreSQL, dockerd + runsc.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use common::TestGateway;
use gateway::audit::AuditStore;
use serde_json::{json, Value};

async fn key_for(gw: &TestGateway, role: &str, principal: &str) -> String {
    let pool = gw.pool().await;
    let key = AuditStore::new(pool.clone())
        .create_key_for(role, "acme", Some(principal))
        .await
        .unwrap();
    pool.close().await;
    key.secret
}

async fn open(gw: &TestGateway, key: &str) -> Value {
    let (status, session) = gw
        .post(key, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    session
}

async fn run(gw: &TestGateway, key: &str, id: &str, code: &str) -> (u16, Value) {
    let path = format!("/v1/sessions/{id}/executions");
    gw.post(key, &path, &json!({ "code": code })).await
}

async fn delete(gw: &TestGateway, key: &str, id: &str) -> (u16, Value) {
    let response = gw
        .http
        .delete(format!("{}/v1/sessions/{id}", gw.url))
        .bearer_auth(key)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn listed(body: &Value, id: &str) -> bool {
    body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == id)
}

#[tokio::test]
async fn another_key_of_the_tenant_finds_nothing_of_a_session_it_did_not_open() {
    let gw = TestGateway::start().await;
    let owner = key_for(&gw, "agent", "ana").await;
    let intruder = key_for(&gw, "agent", "mallory").await;
    let session = open(&gw, &owner).await;
    let id = session["id"].as_str().unwrap();
    let (status, first) = run(&gw, &owner, id, "secret = 'owner data'\nsecret").await;
    assert_eq!(status, 200, "{first}");
    let execution = first["id"].as_str().unwrap();

    // Every route answers as for a missing id.
    let (status, body) = gw.get(&intruder, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 404, "get: {body}");
    let (status, body) = run(&gw, &intruder, id, "secret").await;
    assert_eq!(status, 404, "run: {body}");
    let (status, body) = delete(&gw, &intruder, id).await;
    assert_eq!(status, 404, "delete: {body}");
    let (status, body) = gw.get(&intruder, "/v1/sessions").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !listed(&body, id),
        "list shows another key's session: {body}"
    );
    let (status, body) = gw
        .get(&intruder, &format!("/v1/executions/{execution}"))
        .await;
    assert_eq!(status, 404, "an execution of the session: {body}");
    let response = gw
        .http
        .get(format!("{}/v1/executions/{execution}/events", gw.url))
        .bearer_auth(&intruder)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404, "its event stream");

    // Nothing the intruder asked for ran, and the owner's session is as it was.
    let (status, again) = run(&gw, &owner, id, "secret").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["result"], "'owner data'", "{again}");
    let (status, body) = gw.get(&owner, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["executions"], 2, "{body}");
    let (_, body) = gw.get(&owner, "/v1/sessions").await;
    assert!(listed(&body, id), "{body}");
    let (status, body) = delete(&gw, &owner, id).await;
    assert_eq!(status, 200, "{body}");
    gw.stop().await;
}

#[tokio::test]
async fn a_policy_that_shares_sessions_by_principal_shares_them_and_says_so() {
    let gw = TestGateway::start().await;
    let owner = key_for(&gw, "agent", "ana").await;
    let second = key_for(&gw, "agent", "ana").await;
    let session = open(&gw, &owner).await;
    let id = session["id"].as_str().unwrap();
    let (status, first) = run(&gw, &owner, id, "x = 41").await;
    assert_eq!(status, 200, "{first}");

    // acme shares by principal: ana's second key sees and uses the session.
    let (status, body) = gw.get(&second, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{body}");
    let (status, shared) = run(&gw, &second, id, "x + 1").await;
    assert_eq!(status, 200, "{shared}");
    assert_eq!(shared["result"], "42", "{shared}");
    let codes: Vec<&str> = shared["decision"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["session.shared"], "{shared}");

    // The policy saw who asked and whose session it is.
    let pool = gw.pool().await;
    let input: Value = sqlx::query_scalar(
        "SELECT input FROM audit_events WHERE kind = 'execution.decision' \
         AND execution_id = $1",
    )
    .bind(shared["id"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    let asked = &input["request"]["session"];
    assert_eq!(asked["owner"]["principal"], "ana", "{input}");
    assert_eq!(asked["asked_by"]["principal"], "ana", "{input}");
    assert_ne!(
        asked["owner"]["key_id"], asked["asked_by"]["key_id"],
        "{input}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_session_carries_its_decision_with_an_id_like_an_execution() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let session = open(&gw, &agent).await;
    let id = session["id"].as_str().unwrap();
    let decision = &session["decision"];
    let decision_id = decision["id"].as_str().expect("decision.id");
    assert!(decision_id.starts_with("dc_"), "{session}");
    assert_eq!(decision["allow"], true, "{session}");
    assert!(decision["policy_revision"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    // Deserializes as an execution's decision view.
    let _: api_types::DecisionView = serde_json::from_value(decision.clone()).unwrap();
    let (_, read) = gw.get(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(read["decision"]["id"], decision_id, "{read}");
    // The audit log names the same decision.
    let pool = gw.pool().await;
    let logged: Option<String> = sqlx::query_scalar(
        "SELECT decision_id FROM audit_events WHERE kind = 'session.created' \
         AND input->>'session_id' = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(logged.as_deref(), Some(decision_id));
    gw.stop().await;
}
