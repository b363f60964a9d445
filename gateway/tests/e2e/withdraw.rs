//! An agent withdraws its own request while it waits for review (issue 16 item 11), through
//! the HTTP API with the real policy and Postgres: the execution ends `cancelled` with reason
//! `approval.withdrawn`, the approval is `withdrawn`, one `approval.withdrawn` event is in the
//! chain, a waiting events stream ends with that record, and nothing can decide it afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::common;

use std::time::Duration;

use serde_json::json;

use common::TestGateway;

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_withdraws_its_pending_request_and_it_is_audited() {
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    let stranger = gw.key_of("agent", "globex", "team-g").await;
    let reviewer = gw.key_of("reviewer", "acme", "bob").await;

    let (status, held) = gw
        .execute(
            &agent,
            "python",
            "print('never runs')",
            json!({"network": [{"host": "review.example", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["id"].as_str().unwrap().to_owned();
    let approval = held["approval_id"].as_str().unwrap().to_owned();
    let waiting = tokio::spawn(gw.events(&agent, &id).await.collect());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the stream waits for the review");

    // Another tenant's agent cannot even see it.
    let cancel = format!("/v1/executions/{id}/cancel");
    let (status, body) = gw.post(&stranger, &cancel, &json!({})).await;
    assert_eq!(status, 404, "{body}");

    let (status, record) = gw.post(&agent, &cancel, &json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "cancelled", "{record}");
    let codes: Vec<&str> = record["decision"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["network.review_required", "approval.withdrawn"],
        "{record}"
    );
    assert!(record["started_at"].is_null(), "nothing ran: {record}");

    let events = waiting.await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].name, "exit");
    assert_eq!(events[0].data["status"], "cancelled", "{events:?}");

    // Decided now: a second withdrawal and a late review are conflicts.
    let (status, body) = gw.post(&agent, &cancel, &json!({})).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = gw
        .post(
            &reviewer,
            &format!("/v1/approvals/{approval}"),
            &json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    let (_, shown) = gw
        .get(&reviewer, &format!("/v1/approvals/{approval}"))
        .await;
    assert_eq!(shown["status"], "withdrawn", "{shown}");
    let (status, listed) = gw.get(&reviewer, "/v1/approvals?status=withdrawn").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["approvals"][0]["id"], approval.as_str(), "{listed}");

    let pool = gw.pool().await;
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM audit_events WHERE execution_id = $1 ORDER BY seq")
            .bind(&id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        kinds,
        [
            "execution.decision",
            "approval.requested",
            "approval.withdrawn"
        ]
    );
    let payload: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT request FROM approvals WHERE id = $1")
            .bind(&approval)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(payload.is_none(), "the held code is cleared");
    let (_, verified) = gw
        .get(
            &gw.key_of("auditor", "acme", "dana").await,
            "/v1/audit/verify",
        )
        .await;
    assert!(verified["broken"].is_null(), "{verified}");
    pool.close().await;
    gw.stop().await;
}
