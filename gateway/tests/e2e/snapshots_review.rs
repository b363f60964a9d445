//! A fork held for review (issue 24, docs/snapshots.md): `POST /v1/sessions` with
//! `from_snapshot` and a destination the shipped policy sends to review is held (202); once a
//! reviewer approves, the session starts FROM THE SNAPSHOT (its variables and files), under the
//! reviewed decision's grant, not cold. A snapshot deleted while the fork waited: the approved
//! session does not start (`start_failed`, naming the snapshot). Through the real stack on the
//! private experimental dockerd (`snapshots::shared_daemon`).

use crate::common;

use common::TestGateway;
use serde_json::{json, Value};

use crate::snapshots::{gateway_with, open, run, shared_daemon};

/// A fork of `snapshot` asking for a destination acme's allowlist does not cover.
async fn held_fork(gw: &TestGateway, agent: &str, snapshot: &str) -> (String, String) {
    let body = json!({
        "language": "python",
        "from_snapshot": snapshot,
        "network": [{"host": "review.example", "port": 443}],
    });
    let (status, held) = gw.post(agent, "/v1/sessions", &body).await;
    assert_eq!(status, 202, "{held}");
    assert_eq!(held["status"], "pending_approval", "{held}");
    let approval = held["approval_id"].as_str().unwrap().to_owned();
    (held["id"].as_str().unwrap().to_owned(), approval)
}

async fn approve(gw: &TestGateway, reviewer: &str, approval: &str) -> Value {
    let path = format!("/v1/approvals/{approval}");
    let (status, decided) = gw
        .post(reviewer, &path, &json!({"decision": "approve"}))
        .await;
    assert_eq!(status, 200, "{decided}");
    decided
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approved_fork_starts_from_its_snapshot_not_cold() {
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let gw = gateway_with(&daemon, url, tempfile::tempdir().unwrap(), |_| {}).await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    let reviewer = gw.key_of("reviewer", "acme", "bob").await;
    let parent = open(&gw, &agent, "python").await;
    run(
        &gw,
        &agent,
        &parent,
        "x = 41\nopen('/workspace/kept.txt', 'w').write('kept')",
    )
    .await;
    let (status, snapshot) = gw
        .post(
            &agent,
            &format!("/v1/sessions/{parent}/snapshots"),
            &json!({}),
        )
        .await;
    assert_eq!(status, 201, "{snapshot}");
    let snapshot = snapshot["id"].as_str().unwrap().to_owned();

    let (fork, approval) = held_fork(&gw, &agent, &snapshot).await;
    let (status, listed) = gw
        .get(&reviewer, &format!("/v1/approvals/{approval}"))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["request"]["from_snapshot"]["id"], snapshot.as_str());
    let decided = approve(&gw, &reviewer, &approval).await;
    assert_eq!(decided["session"]["status"], "ready", "{decided}");
    let read = run(
        &gw,
        &agent,
        &fork,
        "(x + 1, open('/workspace/kept.txt').read())",
    )
    .await;
    assert_eq!(read["result"], "(42, 'kept')", "{read}");
    // Its `session.created` names the snapshot it was restored from, and that image's digest.
    let pool = gw.pool().await;
    let created: Value = sqlx::query_scalar(
        "SELECT input FROM audit_events WHERE kind = 'session.created' \
         AND input->>'session_id' = $1",
    )
    .bind(&fork)
    .fetch_one(&pool)
    .await
    .unwrap();
    let sha256: String = sqlx::query_scalar("SELECT sha256 FROM snapshots WHERE id = $1")
        .bind(&snapshot)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        created["from_snapshot"]["id"],
        snapshot.as_str(),
        "{created}"
    );
    assert_eq!(
        created["from_snapshot"]["sha256"],
        sha256.as_str(),
        "{created}"
    );
    assert_eq!(
        created["from_snapshot"]["session_id"],
        parent.as_str(),
        "{created}"
    );

    // A snapshot gone while its fork waited: the approved fork does not start.
    let (other, approval) = held_fork(&gw, &agent, &snapshot).await;
    let (status, deleted) = gw
        .delete(&agent, &format!("/v1/snapshots/{snapshot}"))
        .await;
    assert_eq!(status, 200, "{deleted}");
    let decided = approve(&gw, &reviewer, &approval).await;
    assert_eq!(decided["session"]["status"], "closed", "{decided}");
    assert_eq!(
        decided["session"]["closed_reason"], "start_failed",
        "{decided}"
    );
    let closed: Value = sqlx::query_scalar(
        "SELECT reasons FROM audit_events WHERE kind = 'session.closed' \
         AND input->>'session_id' = $1",
    )
    .bind(&other)
    .fetch_one(&gw.pool().await)
    .await
    .unwrap();
    assert!(closed.to_string().contains(&snapshot), "{closed}");
    gw.stop().await;
}
