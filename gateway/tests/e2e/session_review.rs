//! Sessions held for review (DESIGN 10: `POST /v1/sessions` -> 202 `pending_approval`) through
//! the real stack: the shipped policy, PostgreSQL, dockerd + runsc and sandbox-init's session
//! runner. Held -> approved by a reviewer of another principal -> `ready`, state kept; held ->
//! rejected -> `closed` (`denied`); held -> withdrawn (`DELETE`); held -> expired; a held session
//! counts against `max_sessions`; every step audited and the chain intact.

use crate::common;

use std::time::Duration;

use common::TestGateway;
use serde_json::{json, Value};

/// A session asking for a destination acme's allowlist does not cover: the shipped policy
/// sends it to review (`network.review_required`).
fn held_body() -> Value {
    json!({
        "language": "python",
        "network": [{"host": "review.example", "port": 443}],
        "idle_timeout_s": 120,
        "ttl_s": 600,
    })
}

/// Opens a session the policy holds; returns (session id, approval id).
async fn held(gw: &TestGateway, agent: &str) -> (String, String) {
    let (status, body) = gw.post(agent, "/v1/sessions", &held_body()).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending_approval", "{body}");
    assert!(
        body["container"].is_null(),
        "no sandbox while pending: {body}"
    );
    assert_eq!(body["decision"]["require_approval"], true, "{body}");
    let approval = body["approval_id"].as_str().unwrap().to_owned();
    assert!(approval.starts_with("ap_"), "{body}");
    (body["id"].as_str().unwrap().to_owned(), approval)
}

async fn run(gw: &TestGateway, key: &str, id: &str, code: &str) -> (u16, Value) {
    let path = format!("/v1/sessions/{id}/executions");
    gw.post(key, &path, &json!({ "code": code })).await
}

async fn decide(gw: &TestGateway, reviewer: &str, approval: &str, decision: &str) -> Value {
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw
        .post(
            reviewer,
            &path,
            &json!({"decision": decision, "comment": "checked"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The audit events naming the session, in order: (kind, input).
async fn events_of(gw: &TestGateway, session_id: &str) -> Vec<(String, Value)> {
    let pool = gw.pool().await;
    let rows = sqlx::query_as(
        "SELECT kind, input FROM audit_events WHERE input->>'session_id' = $1 ORDER BY seq",
    )
    .bind(session_id)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows
}

fn kinds(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(kind, _)| kind.as_str()).collect()
}

#[tokio::test]
async fn a_held_session_runs_nothing_until_approved_then_keeps_state() {
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    let own_reviewer = gw.key_of("reviewer", "acme", "team-a").await;
    let bob = gw.key_of("reviewer", "acme", "bob").await;
    let (id, approval) = held(&gw, &agent).await;

    // Nothing runs in it while it waits; the refusal names the approval.
    let (status, body) = run(&gw, &agent, &id, "1").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("awaits approval {approval}")),
        "{body}"
    );

    // The reviewer sees what was asked: a session, its language, network and lifetimes.
    let (status, listed) = gw.get(&bob, &format!("/v1/approvals/{approval}")).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["subject"], "session", "{listed}");
    assert_eq!(listed["session_id"], id.as_str(), "{listed}");
    assert!(listed["execution_id"].is_null(), "{listed}");
    assert_eq!(listed["request"]["kind"], "session", "{listed}");
    assert_eq!(listed["request"]["language"], "python", "{listed}");
    assert_eq!(listed["request"]["network"][0]["host"], "review.example");
    assert_eq!(listed["request"]["idle_timeout_s"], 120, "{listed}");
    assert_eq!(listed["request"]["ttl_s"], 600, "{listed}");
    assert_eq!(
        listed["decision"]["network"]["allow"][0]["host"],
        "review.example"
    );

    // Not by the requesting principal.
    let path = format!("/v1/approvals/{approval}");
    let (status, body) = gw
        .post(&own_reviewer, &path, &json!({"decision": "approve"}))
        .await;
    assert_eq!(status, 403, "{body}");

    let decided = decide(&gw, &bob, &approval, "approve").await;
    assert_eq!(decided["approval"]["status"], "approved", "{decided}");
    assert_eq!(decided["session"]["status"], "ready", "{decided}");
    let ready = gw.session(&agent, &id).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(ready["container"].is_string(), "{ready}");
    assert_eq!(ready["approval_id"], approval.as_str(), "{ready}");

    let (status, first) = run(&gw, &agent, &id, "x = 1").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "succeeded", "{first}");
    let (_, second) = run(&gw, &agent, &id, "x + 1").await;
    assert_eq!(second["result"], "2", "{second}");

    let (status, closed) = gw.delete(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["closed_reason"], "deleted", "{closed}");

    let events = events_of(&gw, &id).await;
    assert_eq!(
        kinds(&events),
        [
            "approval.requested",
            "approval.refused",
            "approval.approved",
            "session.created",
            "session.closed",
        ],
        "{events:?}"
    );
    let requested = &events[0].1;
    assert_eq!(requested["approval_id"], approval.as_str());
    assert_eq!(requested["request"]["request"]["kind"], "session");
    let pool = gw.pool().await;
    let outcome: String = sqlx::query_scalar(
        "SELECT outcome FROM v_decisions WHERE kind = 'approval.requested' LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(outcome, "review", "dashboards count the hold as a review");
    let created = &events[3].1;
    assert_eq!(created["approval_id"], approval.as_str(), "{created}");
    assert_eq!(created["reviewer"]["principal"], "bob", "{created}");
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

#[tokio::test]
async fn a_rejected_session_closes_denied_and_runs_nothing() {
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    let bob = gw.key_of("reviewer", "acme", "bob").await;
    let (id, approval) = held(&gw, &agent).await;

    let decided = decide(&gw, &bob, &approval, "reject").await;
    assert_eq!(decided["approval"]["status"], "rejected", "{decided}");
    assert_eq!(decided["session"]["status"], "closed", "{decided}");
    let closed = gw.session(&agent, &id).await;
    assert_eq!(closed["status"], "closed", "{closed}");
    assert_eq!(closed["closed_reason"], "denied", "{closed}");
    assert!(closed["container"].is_null(), "{closed}");

    let (status, body) = run(&gw, &agent, &id, "1").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("closed (denied)"),
        "{body}"
    );
    // Deciding again is a conflict.
    let path = format!("/v1/approvals/{approval}");
    let (status, _) = gw.post(&bob, &path, &json!({"decision": "approve"})).await;
    assert_eq!(status, 409);

    let events = events_of(&gw, &id).await;
    assert_eq!(
        kinds(&events),
        ["approval.requested", "approval.rejected", "session.denied"],
        "{events:?}"
    );
    assert_eq!(events[2].1["reviewer"]["principal"], "bob", "{events:?}");
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

#[tokio::test]
async fn a_held_session_counts_toward_max_sessions_and_delete_withdraws_it() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| config.max_sessions = 1).await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    let bob = gw.key_of("reviewer", "acme", "bob").await;
    let (id, approval) = held(&gw, &agent).await;

    let plain = json!({"language": "python"});
    let (status, body) = gw.post(&agent, "/v1/sessions", &plain).await;
    assert_eq!(status, 429, "the pending one fills max_sessions: {body}");

    let (status, withdrawn) = gw.delete(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{withdrawn}");
    assert_eq!(withdrawn["status"], "closed", "{withdrawn}");
    assert_eq!(withdrawn["closed_reason"], "deleted", "{withdrawn}");
    let (_, listed) = gw.get(&bob, &format!("/v1/approvals/{approval}")).await;
    assert_eq!(listed["status"], "withdrawn", "{listed}");
    let path = format!("/v1/approvals/{approval}");
    let (status, _) = gw.post(&bob, &path, &json!({"decision": "approve"})).await;
    assert_eq!(status, 409, "a withdrawn approval cannot be decided");

    let (status, body) = gw.post(&agent, "/v1/sessions", &plain).await;
    assert_eq!(status, 201, "the place is free again: {body}");
    let events = events_of(&gw, &id).await;
    assert_eq!(
        kinds(&events),
        ["approval.requested", "approval.withdrawn", "session.closed"],
        "{events:?}"
    );
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

#[tokio::test]
async fn a_held_session_nobody_decides_closes_when_its_approval_expires() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| config.approval_ttl_s = 2).await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    let (id, approval) = held(&gw, &agent).await;

    let mut closed = Value::Null;
    for _ in 0..100 {
        closed = gw.session(&agent, &id).await;
        if closed["status"] == "closed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(closed["closed_reason"], "expired", "{closed}");
    let events = events_of(&gw, &id).await;
    assert_eq!(
        kinds(&events),
        ["approval.requested", "approval.expired", "session.closed"],
        "{events:?}"
    );
    assert_eq!(events[1].1["approval_id"], approval.as_str());
    gw.assert_chain_verifies().await;
    gw.stop().await;
}

/// `sandgate policy replay` re-decides session openings: one held for review, one allowed and
/// one denied. A candidate that stops sending acme's unlisted hosts to review turns the held
/// one into a deny and leaves the others.
#[tokio::test]
async fn policy_replay_re_decides_session_openings_held_for_review() {
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "team-a").await;
    held(&gw, &agent).await;
    let plain = json!({"language": "python"});
    let (status, opened) = gw.post(&agent, "/v1/sessions", &plain).await;
    assert_eq!(status, 201, "{opened}");
    let classroom = gw.key("agent", "classroom").await;
    let (status, _) = gw.post(&classroom, "/v1/sessions", &plain).await;
    assert_eq!(status, 403);

    let config = common::test_config(gw.database_url.clone(), gw.data_dir.path());
    let shipped = common::workspace_root().join("policies");
    let (_, same) = gateway::cli::policy::policy_replay(&config, &shipped, "1h")
        .await
        .unwrap();
    assert_eq!((same.total, same.unchanged), (3, 3), "{same:?}");

    let candidate = common::copy_of_shipped();
    let tenants = candidate.path().join("data/tenants.yaml");
    let text = std::fs::read_to_string(&tenants).unwrap();
    let stricter = text.replacen(
        "review_unlisted_hosts: true",
        "review_unlisted_hosts: false",
        1,
    );
    assert_ne!(
        text, stricter,
        "the shipped acme sends unlisted hosts to review"
    );
    std::fs::write(&tenants, stricter).unwrap();
    let (revision, report) = gateway::cli::policy::policy_replay(&config, candidate.path(), "1h")
        .await
        .unwrap();
    assert_eq!(report.total, 3, "{report:?}");
    assert_eq!(report.transition("review->deny"), 1, "{report:?}");
    assert_eq!(
        report.changed[0].session_id.as_deref().map(|s| &s[..3]),
        Some("ss_")
    );
    let rendered = report.render(&revision, 10);
    assert!(rendered.contains("network.not_allowed"), "{rendered}");
    let _ = gw
        .delete(
            &agent,
            &format!("/v1/sessions/{}", opened["id"].as_str().unwrap()),
        )
        .await;
    gw.stop().await;
}

/// A reviewer whose client gives up while the approved session starts does not leave it stuck,
/// and a `DELETE` that arrives while its sandbox starts is not lost: whatever the order, the
/// session ends `closed` and its sandbox is removed.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_the_reviewer_abandons_and_a_delete_during_the_start_both_hold() {
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "ada").await;
    let reviewer = gw.key_of("reviewer", "acme", "rita").await;
    // The reviewer's client times out long before a sandbox can start.
    let (id, approval) = held(&gw, &agent).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let gone = impatient
        .post(format!("{}/v1/approvals/{approval}", gw.url))
        .bearer_auth(&reviewer)
        .json(&json!({"decision": "approve"}))
        .send()
        .await;
    assert!(gone.is_err(), "the client was meant to give up: {gone:?}");
    let mut opened = Value::Null;
    for _ in 0..300 {
        opened = gw.session(&agent, &id).await;
        if opened["status"] != "pending_approval" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(opened["status"], "ready", "{opened}");
    let (status, _) = run(&gw, &agent, &id, "6 * 7").await;
    assert_eq!(status, 200);
    // Approve and delete at once: the delete wins or follows, never vanishes.
    let (id, approval) = held(&gw, &agent).await;
    let approving = decide(&gw, &reviewer, &approval, "approve");
    let deleting = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        gw.delete(&agent, &format!("/v1/sessions/{id}")).await
    };
    let (_, (status, deleted)) = tokio::join!(approving, deleting);
    assert_eq!(status, 200, "{deleted}");
    let mut last = Value::Null;
    for _ in 0..100 {
        last = gw.session(&agent, &id).await;
        if last["status"] == "closed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last["status"], "closed", "{last}");
    assert_eq!(last["closed_reason"], "deleted", "{last}");
    let sandbox = format!("sandgate-{id}");
    common::eventually(
        Duration::from_secs(15),
        "the session's sandbox is removed",
        || async { !common::container_exists(&sandbox) },
    )
    .await;
    gw.assert_chain_verifies().await;
    gw.stop().await;
}
