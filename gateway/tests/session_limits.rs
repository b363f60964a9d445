//! Issue 21 through the real stack (the in-process gateway, PostgreSQL, dockerd + runsc):
//! `max_sessions` holds under concurrent requests and sessions keep to their share of
//! `max_concurrent` (item 5); revoking a key withdraws its requests held for review (item 9);
//! the auditor's role cannot read key hashes (item 12).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use common::{fresh_database, TestGateway};
use gateway::audit::AuditStore;
use serde_json::{json, Value};

async fn key(gw: &TestGateway, role: &str, tenant: &str, principal: &str) -> (String, String) {
    let pool = gw.pool().await;
    let key = AuditStore::new(pool.clone())
        .create_key_for(role, tenant, Some(principal))
        .await
        .unwrap();
    pool.close().await;
    (key.id, key.secret)
}

async fn not_closed(gw: &TestGateway) -> i64 {
    let pool = gw.pool().await;
    let count = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE status <> 'closed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_concurrent_opens_with_max_sessions_two_open_exactly_two() {
    let url = fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| config.max_sessions = 2).await;
    let agent = gw.key("agent", "acme").await;
    let body = json!({"language": "bash"});
    let opens = (0..8).map(|_| gw.post(&agent, "/v1/sessions", &body));
    let answers = futures_util::future::join_all(opens).await;
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    let opened = statuses.iter().filter(|s| **s == 201).count();
    assert_eq!(opened, 2, "{statuses:?}: {answers:?}");
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 429),
        "{statuses:?}"
    );
    assert_eq!(not_closed(&gw).await, 2);
    // Still two once the others' start-ups are over, and a ninth is refused.
    let (status, body) = gw.post(&agent, "/v1/sessions", &body).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(not_closed(&gw).await, 2);
    gw.stop().await;
}

async fn sessions_open_metric(gw: &TestGateway, auditor: &str) -> String {
    let response = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .bearer_auth(auditor)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.unwrap();
    text.lines()
        .find(|line| line.starts_with("sandgate_sessions_open "))
        .unwrap_or_else(|| panic!("no sandgate_sessions_open in {text}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_keep_to_their_share_of_max_concurrent_and_are_counted() {
    let url = fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| {
        config.max_concurrent = 2;
        config.max_sessions = 4;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let auditor = gw.key("auditor", "audit").await;
    assert_eq!(
        sessions_open_metric(&gw, &auditor).await,
        "sandgate_sessions_open 0"
    );
    let (status, first) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "bash"}))
        .await;
    assert_eq!(status, 201, "{first}");
    // Half of max_concurrent (one slot) is the sessions' share: a second session waits for
    // none, it is refused, and a plain execution still runs.
    let (status, second) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "bash"}))
        .await;
    assert_eq!(status, 429, "{second}");
    let (status, plain) = gw.execute(&agent, "bash", "echo plain", json!({})).await;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain["stdout"], "plain\n", "{plain}");
    assert_eq!(
        sessions_open_metric(&gw, &auditor).await,
        "sandgate_sessions_open 1"
    );
    let id = first["id"].as_str().unwrap();
    let response = gw
        .http
        .delete(format!("{}/v1/sessions/{id}", gw.url))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        sessions_open_metric(&gw, &auditor).await,
        "sandgate_sessions_open 0"
    );
    let (status, again) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "bash"}))
        .await;
    assert_eq!(
        status, 201,
        "the share is given back when a session closes: {again}"
    );
    gw.stop().await;
}

fn codes(reasons: &Value) -> Vec<String> {
    reasons
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn revoking_a_key_withdraws_its_requests_held_for_review() {
    let gw = TestGateway::start().await;
    let (agent_id, agent) = key(&gw, "agent", "acme", "ana").await;
    let (_, reviewer) = key(&gw, "reviewer", "acme", "rita").await;
    let (_, admin) = key(&gw, "admin", "ops", "olga").await;
    let unlisted = json!([{"host": "review.example", "port": 443}]);
    let (status, execution) = gw
        .execute(
            &agent,
            "python",
            "print('held')",
            json!({"network": unlisted}),
        )
        .await;
    assert_eq!(status, 202, "{execution}");
    let (status, session) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "python", "network": unlisted}),
        )
        .await;
    assert_eq!(status, 202, "{session}");

    let response = gw
        .http
        .delete(format!("{}/v1/keys/{agent_id}", gw.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    // Neither can be approved any more: both were withdrawn with the key.
    for held in [&execution, &session] {
        let approval = held["approval_id"].as_str().unwrap();
        let (status, body) = gw
            .post(
                &reviewer,
                &format!("/v1/approvals/{approval}"),
                &json!({"decision": "approve"}),
            )
            .await;
        assert_eq!(status, 409, "{body}");
        let (_, listed) = gw
            .get(&reviewer, &format!("/v1/approvals/{approval}"))
            .await;
        assert_eq!(listed["status"], "withdrawn", "{listed}");
    }
    let execution_id = execution["id"].as_str().unwrap();
    let (_, record) = gw
        .get(&admin, &format!("/v1/executions/{execution_id}"))
        .await;
    assert_eq!(record["status"], "cancelled", "{record}");
    assert!(
        codes(&record["decision"]["reasons"]).contains(&"key.revoked".to_owned()),
        "{record}"
    );
    assert!(record["started_at"].is_null(), "it never ran: {record}");
    let session_id = session["id"].as_str().unwrap();
    let (_, closed) = gw.get(&admin, &format!("/v1/sessions/{session_id}")).await;
    assert_eq!(closed["status"], "closed", "{closed}");
    assert_eq!(closed["closed_reason"], "deleted", "{closed}");
    assert!(closed["container"].is_null(), "{closed}");

    // Audited: one approval.withdrawn per request, naming the revoked key.
    let pool = gw.pool().await;
    let withdrawn: Vec<(Value, Value)> = sqlx::query_as(
        "SELECT input, reasons FROM audit_events WHERE kind = 'approval.withdrawn' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(withdrawn.len(), 2, "{withdrawn:?}");
    for (input, reasons) in &withdrawn {
        assert_eq!(input["requested_by"], agent_id.as_str(), "{input}");
        assert_eq!(codes(reasons), ["key.revoked"], "{reasons}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn the_auditor_role_reads_keys_without_their_hashes() {
    let gw = TestGateway::start().await;
    let _agent = gw.key("agent", "acme").await;
    let owner = gw.pool().await;
    let mut conn = owner.acquire().await.unwrap();
    sqlx::query("SET ROLE sandgate_auditor")
        .execute(&mut *conn)
        .await
        .unwrap();
    let keys: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT id, role, tenant, principal, created_at, revoked_at, \
         expires_at, last_used_at FROM api_keys) AS k",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(keys, 1);
    for statement in ["SELECT key_hash FROM api_keys", "SELECT * FROM api_keys"] {
        let refused = sqlx::query(statement).execute(&mut *conn).await;
        let err = refused.expect_err(statement);
        let code = err.as_database_error().and_then(|e| e.code()).unwrap();
        assert_eq!(code, "42501", "auditor: {statement}: {err}");
    }
    sqlx::query("RESET ROLE").execute(&mut *conn).await.unwrap();
    drop(conn);
    owner.close().await;
    gw.stop().await;
}
