//! Human review end to end through the HTTP API, with the real policy, Postgres, dockerd and
//! runsc: held -> listed -> approved by another principal -> runs as reviewed; rejected;
//! self-approval refused; expired; every step audited and the chain intact.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::common;

use std::time::Duration;

use serde_json::{json, Value};

use common::TestGateway;
use gateway::audit::AuditStore;

/// A destination acme's allowlist does not cover: the shipped policy sends it to review.
fn unlisted() -> Value {
    json!([{"host": "review.example", "port": 443}])
}

/// Sends a request the policy holds for review; returns (execution id, approval id).
async fn held(gw: &TestGateway, agent: &str, code: &str) -> (String, String) {
    let (status, body) = gw
        .execute(
            agent,
            "python",
            code,
            json!({"network": unlisted(), "limits": {"memory_mb": 256, "timeout_ms": 20000}}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending_approval", "{body}");
    let codes: Vec<&str> = body["decision"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["network.review_required"], "{body}");
    let approval = body["approval_id"].as_str().unwrap();
    assert!(approval.starts_with("ap_"), "{body}");
    (body["id"].as_str().unwrap().to_owned(), approval.to_owned())
}

async fn finished(gw: &TestGateway, key: &str, id: &str) -> Value {
    for _ in 0..600 {
        let (status, body) = gw.get(key, &format!("/v1/executions/{id}")).await;
        assert_eq!(status, 200, "{body}");
        if !body["finished_at"].is_null() {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("execution {id} did not finish");
}

async fn event_kinds(gw: &TestGateway, execution_id: &str) -> Vec<(String, Option<String>, Value)> {
    let pool = gw.pool().await;
    let rows: Vec<(String, Option<String>, Value)> = sqlx::query_as(
        "SELECT kind, key_id, input FROM audit_events WHERE execution_id = $1 ORDER BY seq",
    )
    .bind(execution_id)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows
}

#[tokio::test]
async fn approved_by_another_principal_runs_as_reviewed() {
    let gw = TestGateway::start().await;
    let (agent_id, agent) = gw.key_with_id("agent", "acme", "team-a").await;
    let (_, own_reviewer) = gw.key_with_id("reviewer", "acme", "team-a").await;
    let (bob_id, bob) = gw.key_with_id("reviewer", "acme", "bob").await;

    let (id, approval) = held(&gw, &agent, "print('reviewed')").await;
    assert!(common::removed_soon(&id), "nothing runs before review");

    // Agents cannot see the queue; reviewers see it with what would run.
    let (status, _) = gw.get(&agent, "/v1/approvals?status=pending").await;
    assert_eq!(status, 403);
    let (status, body) = gw.get(&bob, "/v1/approvals?status=pending").await;
    assert_eq!(status, 200, "{body}");
    let listed = body["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == approval.as_str())
        .unwrap_or_else(|| panic!("{approval} not listed: {body}"))
        .clone();
    assert_eq!(listed["execution_id"], id.as_str());
    assert_eq!(listed["status"], "pending");
    assert_eq!(listed["requested_by"]["key_id"], agent_id.as_str());
    assert_eq!(listed["requested_by"]["principal"], "team-a");
    assert_eq!(listed["decision"]["limits"]["memory_mb"], 256);
    assert_eq!(
        listed["decision"]["network"]["allow"][0]["host"],
        "review.example"
    );
    assert_eq!(listed["code_preview"], "print('reviewed')");
    let (status, _) = gw.get(&bob, "/v1/approvals?status=bogus").await;
    assert_eq!(status, 400);

    // The reaper closes abandoned queued/running records, never one waiting for review.
    let pool = gw.pool().await;
    AuditStore::new(pool.clone())
        .close_abandoned(&gw.instance().await, |_| false, "test sweep")
        .await
        .unwrap();
    pool.close().await;
    let (_, row) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(row["status"], "pending_approval", "{row}");

    // A reviewer key of the requesting principal cannot approve its own request.
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw
        .post(&own_reviewer, &path, &json!({"decision": "approve"}))
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot approve its own request"),
        "{body}"
    );
    let (status, _) = gw
        .post(&agent, &path, &json!({"decision": "approve"}))
        .await;
    assert_eq!(status, 403, "agents cannot decide");
    let (_, body) = gw.get(&bob, &path).await;
    assert_eq!(body["status"], "pending", "{body}");

    // Another principal approves: it runs in gVisor with the reviewed decision.
    let (status, body) = gw
        .post(
            &bob,
            &path,
            &json!({"decision": "approve", "comment": "checked the host"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approval"]["status"], "approved");
    assert_eq!(body["approval"]["reviewer"]["principal"], "bob");
    let done = finished(&gw, &agent, &id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["stdout"], "reviewed\n");
    assert_eq!(done["limits"]["memory_mb"], 256);
    assert_eq!(done["limits"]["timeout_ms"], 20000);
    assert_eq!(done["decision"]["backend"], "gvisor");

    // Deciding twice is a conflict.
    let (status, _) = gw.post(&bob, &path, &json!({"decision": "reject"})).await;
    assert_eq!(status, 409);

    // The listing shows it, and every step is in the audit chain.
    let (status, body) = gw.get(&bob, "/v1/executions?limit=5").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["executions"][0]["id"], id.as_str());
    assert!(body["executions"][0].get("stdout").is_none(), "{body}");
    let other_tenant = gw.key("agent", "forge").await;
    let (status, body) = gw.get(&other_tenant, "/v1/executions").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["executions"],
        json!([]),
        "agents see their own tenant only"
    );
    let (status, body) = gw
        .get(&bob, "/v1/executions?status=succeeded&limit=1")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["executions"][0]["id"], id.as_str());
    let (status, _) = gw.get(&bob, "/v1/executions?status=bogus").await;
    assert_eq!(status, 400);
    let events = event_kinds(&gw, &id).await;
    let kinds: Vec<&str> = events.iter().map(|(kind, ..)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "execution.decision",
            "approval.requested",
            "approval.refused",
            "approval.approved"
        ],
        "{events:?}"
    );
    let (_, key, input) = &events[3];
    assert_eq!(key.as_deref(), Some(bob_id.as_str()));
    assert_eq!(input["reviewer"]["principal"], "bob");
    assert_eq!(input["comment"], "checked the host");
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

#[tokio::test]
async fn rejected_and_expired_requests_end_denied() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| config.approval_ttl_s = 2).await;
    let (_, agent) = gw.key_with_id("agent", "acme", "team-a").await;
    let (_, bob) = gw.key_with_id("reviewer", "acme", "bob").await;

    // Rejected: denied with the reviewer's comment, never run.
    let (id, approval) = held(&gw, &agent, "print('no')").await;
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw
        .post(
            &bob,
            &path,
            &json!({"decision": "reject", "comment": "host unknown"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["execution"]["status"], "denied", "{body}");
    let (_, row) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(row["status"], "denied");
    let rejected = row["decision"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["code"] == "approval.rejected")
        .unwrap_or_else(|| panic!("no approval.rejected: {row}"));
    assert!(rejected["message"]
        .as_str()
        .unwrap()
        .contains("host unknown"));
    assert!(common::removed_soon(&id));

    // Expired, noticed on read: denied, and too late to approve.
    let (id, approval) = held(&gw, &agent, "print('late')").await;
    let path = format!("/v1/approvals/{approval}");
    let (_, pending) = gw.get(&bob, &path).await;
    common::sleep_past(&pending["expires_at"]).await;
    let (status, body) = gw.post(&bob, &path, &json!({"decision": "approve"})).await;
    assert_eq!(status, 409, "{body}");
    let (_, body) = gw.get(&bob, &path).await;
    assert_eq!(body["status"], "expired", "{body}");
    let (_, row) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(row["status"], "denied", "{row}");
    assert!(
        row["decision"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["code"] == "approval.expired"),
        "{row}"
    );
    assert!(common::removed_soon(&id));

    // Expired by the periodic task, without anyone reading the approvals.
    let (id, _) = held(&gw, &agent, "print('forgotten')").await;
    let mut status = String::new();
    for _ in 0..50 {
        let (_, row) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
        status = row["status"].as_str().unwrap().to_owned();
        if status == "denied" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status, "denied");
    let kinds: Vec<String> = event_kinds(&gw, &id)
        .await
        .into_iter()
        .map(|(kind, ..)| kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "execution.decision",
            "approval.requested",
            "approval.expired"
        ]
    );
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

#[tokio::test]
async fn keys_have_a_principal_defaulting_to_their_id() {
    let url = common::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let config = common::test_config(Some(url.clone()), dir.path());
    let named = gateway::cli::keys::create_key_for(&config, "reviewer", "acme", Some("alice"))
        .await
        .unwrap();
    let plain = gateway::cli::keys::create_key(&config, "agent", "acme")
        .await
        .unwrap();
    let bad = gateway::cli::keys::create_key_for(&config, "agent", "acme", Some("a\nb")).await;
    assert!(bad.is_err(), "control characters refused");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let store = AuditStore::new(pool.clone());
    let named = store.find_key(&named.secret).await.unwrap().unwrap();
    assert_eq!(named.principal, "alice");
    let plain_key = store.find_key(&plain.secret).await.unwrap().unwrap();
    assert_eq!(plain_key.principal, plain.id);
    pool.close().await;
}

/// Makes every INSERT into `table` fail, as a full disk would.
async fn refuse_inserts(gw: &TestGateway, table: &str) {
    let pool = gw.pool().await;
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION refuse_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'simulated: no space left on device'; END; $$; \
         CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} \
         FOR EACH ROW EXECUTE FUNCTION refuse_{table}();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
}

#[tokio::test]
async fn holding_and_approving_fail_closed() {
    let gw = TestGateway::start().await;
    let (_, agent) = gw.key_with_id("agent", "acme", "team-a").await;
    let (_, bob) = gw.key_with_id("reviewer", "acme", "bob").await;
    let label = format!("sandgate.instance={}", gw.instance().await);

    // Held, then the audit store refuses: approving answers 503, nothing runs, still pending.
    let (id, approval) = held(&gw, &agent, "print('never')").await;
    refuse_inserts(&gw, "audit_events").await;
    let since = common::docker_now();
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw.post(&bob, &path, &json!({"decision": "approve"})).await;
    assert_eq!(status, 503, "{body}");
    assert!(!body.to_string().contains("simulated"), "{body}");
    let (_, body) = gw.get(&bob, &path).await;
    assert_eq!(body["status"], "pending", "{body}");
    let (_, row) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(row["status"], "pending_approval", "{row}");
    assert!(
        common::containers_created_since(&since, &label).is_empty(),
        "a container was created although the approval was not committed"
    );

    // The approvals table refuses: the request is not held half-way (503, no rows at all).
    let pool = gw.pool().await;
    sqlx::raw_sql("DROP TRIGGER refuse_audit_events ON audit_events")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    refuse_inserts(&gw, "approvals").await;
    let (status, body) = gw
        .execute(&agent, "python", "print(2)", json!({"network": unlisted()}))
        .await;
    assert_eq!(status, 503, "{body}");
    let pool = gw.pool().await;
    let executions: i64 = sqlx::query_scalar("SELECT count(*) FROM executions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(executions, 1, "only the first request is recorded");
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE kind = 'approval.requested'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(events, 1, "the refused request left no event");
    pool.close().await;
    gw.stop().await;
}

/// What was reviewed is what runs, or nothing: if the gateway's configuration changed while the
/// request waited (here a restart with a lower memory ceiling), approving is refused (409) and
/// the approval stays pending for a reviewer to reject.
#[tokio::test(flavor = "multi_thread")]
async fn approval_is_refused_when_the_reviewed_decision_no_longer_fits() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url.clone()), |_| {}).await;
    let (_, agent) = gw.key_with_id("agent", "acme", "bot").await;
    let (_, reviewer) = gw.key_with_id("reviewer", "acme", "alice").await;
    let (execution, approval) = held(&gw, &agent, "print('ok')").await;
    let data_dir = gw.stop_keeping_data().await;
    let gw = TestGateway::start_in(Some(url), data_dir, |config| {
        config.ceilings.memory_mb = 128;
    })
    .await;
    let (status, body) = gw
        .post(
            &reviewer,
            &format!("/v1/approvals/{approval}"),
            &json!({"decision": "approve", "comment": "fine"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("ceilings"), "{message}");
    let (_, record) = gw.get(&agent, &format!("/v1/executions/{execution}")).await;
    assert_eq!(record["status"], "pending_approval", "{record}");
    assert!(common::removed_soon(&execution));
    gw.stop().await;
}

/// The events stream of a held request answers at once and waits for the review: an approval
/// then streams the run, a rejection ends the stream with the denied record.
#[tokio::test(flavor = "multi_thread")]
async fn events_of_a_held_request_wait_for_the_review() {
    let gw = TestGateway::start().await;
    let (_, agent) = gw.key_with_id("agent", "acme", "team-a").await;
    let (_, bob) = gw.key_with_id("reviewer", "acme", "bob").await;

    let (id, approval) = held(&gw, &agent, "print('after review')").await;
    let reader = gw.events(&agent, &id).await;
    let waiting = tokio::spawn(reader.collect());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the stream waits for the reviewer");
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw.post(&bob, &path, &json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "{body}");
    let events = waiting.await.unwrap();
    assert_eq!(
        common::payloads::streamed_text(&events, "stdout"),
        "after review\n",
        "{events:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(
        (last.name.as_str(), &last.data["status"]),
        ("exit", &json!("succeeded"))
    );

    let (id, approval) = held(&gw, &agent, "print('never')").await;
    let waiting = tokio::spawn(gw.events(&agent, &id).await.collect());
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw.post(&bob, &path, &json!({"decision": "reject"})).await;
    assert_eq!(status, 200, "{body}");
    let events = waiting.await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].name, "exit");
    assert_eq!(events[0].data["status"], "denied", "{events:?}");
    gw.stop().await;
}
