//! The one decision pipeline (`app/pipeline.rs`), branch by branch, through the real stack (the
//! shipped policy, PostgreSQL, dockerd + runsc): every subject (an execution, a session, an
//! execution in a session; E2B calls map onto these) ends denied, held for review or admitted,
//! and each outcome answers and is recorded the same way whatever the subject.

use crate::common;

use common::TestGateway;
use serde_json::{json, Value};

/// The audit events of an execution, in order: (kind, allow).
async fn execution_events(gw: &TestGateway, id: &str) -> Vec<(String, Option<bool>)> {
    events(gw, "execution_id = $1", id).await
}

/// The audit events naming a session, in order: (kind, allow).
async fn session_events(gw: &TestGateway, id: &str) -> Vec<(String, Option<bool>)> {
    events(gw, "input->>'session_id' = $1", id).await
}

async fn events(gw: &TestGateway, filter: &str, id: &str) -> Vec<(String, Option<bool>)> {
    let pool = gw.pool().await;
    let rows = sqlx::query_as(&format!(
        "SELECT kind, allow FROM audit_events WHERE {filter} ORDER BY seq"
    ))
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows
}

fn event(kind: &str, allow: bool) -> (String, Option<bool>) {
    (kind.to_owned(), Some(allow))
}

/// acme reviews destinations its allowlist does not cover (`network.review_required`).
fn unlisted() -> Value {
    json!([{"host": "review.example", "port": 443}])
}

#[tokio::test]
async fn an_execution_is_denied_held_or_admitted_and_recorded_as_such() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let ask = |body: Value| {
        let (gw, agent) = (&gw, &agent);
        async move { gw.post(agent, "/v1/executions", &body).await }
    };

    let (status, denied) = ask(json!({
        "language": "python", "code": "print(1)", "limits": {"timeout_ms": 0},
    }))
    .await;
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["error"]["code"], "policy_denied", "{denied}");
    let id = denied["error"]["execution_id"].as_str().unwrap();
    let (_, row) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(row["status"], "denied", "{row}");
    assert_eq!(
        execution_events(&gw, id).await,
        [event("execution.decision", false)]
    );

    let (status, held) = ask(json!({
        "language": "python", "code": "print(1)", "network": unlisted(),
    }))
    .await;
    assert_eq!(status, 202, "{held}");
    assert_eq!(held["status"], "pending_approval", "{held}");
    assert!(held["approval_id"].as_str().unwrap().starts_with("ap_"));
    let id = held["id"].as_str().unwrap();
    assert_eq!(
        execution_events(&gw, id).await,
        [
            event("execution.decision", true),
            event("approval.requested", true)
        ]
    );

    let (status, ran) = ask(json!({"language": "python", "code": "print(1)"})).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["status"], "succeeded", "{ran}");
    let id = ran["id"].as_str().unwrap();
    let kinds = execution_events(&gw, id).await;
    assert_eq!(kinds.first(), Some(&event("execution.decision", true)));
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

#[tokio::test]
async fn a_session_and_its_executions_are_denied_held_or_admitted_and_recorded_as_such() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let student = gw.key("agent", "classroom").await;

    // classroom may not open sessions: denied, `session.denied`, no row.
    let (status, denied) = gw
        .post(&student, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["error"]["code"], "policy_denied", "{denied}");

    let held_body = json!({"language": "python", "network": unlisted()});
    let (status, held) = gw.post(&agent, "/v1/sessions", &held_body).await;
    assert_eq!(status, 202, "{held}");
    assert_eq!(held["status"], "pending_approval", "{held}");
    let id = held["id"].as_str().unwrap();
    assert_eq!(
        session_events(&gw, id).await,
        [event("approval.requested", true)]
    );

    let (status, opened) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{opened}");
    assert_eq!(opened["status"], "ready", "{opened}");
    let id = opened["id"].as_str().unwrap().to_owned();
    assert_eq!(
        session_events(&gw, &id).await,
        [event("session.created", true)]
    );

    // In the session: denied (recorded, nothing runs, the session stays usable), admitted.
    let path = format!("/v1/sessions/{id}/executions");
    let refused = json!({"code": "x = 1", "limits": {"timeout_ms": 0}});
    let (status, denied) = gw.post(&agent, &path, &refused).await;
    assert_eq!(status, 403, "{denied}");
    let turn = denied["error"]["execution_id"].as_str().unwrap();
    assert_eq!(
        execution_events(&gw, turn).await,
        [event("execution.decision", false)]
    );
    let (status, ran) = gw.post(&agent, &path, &json!({"code": "6 * 7"})).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["result"], "42", "{ran}");
    assert_eq!(ran["session_id"], id.as_str(), "{ran}");
    let turn = ran["id"].as_str().unwrap();
    let kinds = execution_events(&gw, turn).await;
    assert_eq!(kinds.first(), Some(&event("execution.decision", true)));
    assert_eq!(gw.session(&agent, &id).await["executions"], 1);
    gw.assert_chain_verifies().await;
    gw.stop().await;
}
