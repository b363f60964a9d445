//! Access hardening (issue 15, items 7, 12, 13) through the HTTP API with the real policy and
//! Postgres: bounded pending approvals and a paged listing that a flood cannot hide a request
//! in; principals compared in one normalised form (in the app and in SQL); keys that can be
//! listed, revoked, rotated and expire, refused at once everywhere, each change audited.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use common::TestGateway;
use gateway::audit::approvals::{ApprovalSubject, Verdict};
use gateway::audit::{AuditStore, NewEvent};

/// A destination acme's allowlist does not cover: the shipped policy sends it to review.
fn held_body(code: &str) -> Value {
    json!({"language": "python", "code": code, "wait": false,
           "network": [{"host": "review.example", "port": 443}]})
}

async fn kinds(gw: &TestGateway, kind: &str) -> Vec<Value> {
    let pool = gw.pool().await;
    let rows: Vec<(Value,)> =
        sqlx::query_as("SELECT input FROM audit_events WHERE kind = $1 ORDER BY seq")
            .bind(kind)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().map(|(input,)| input).collect()
}

/// Every pending approval id, following `next_before` page by page (`limit` per page).
async fn all_pending(gw: &TestGateway, reviewer: &str, limit: u32) -> Vec<String> {
    let mut ids = Vec::new();
    let mut path = format!("/v1/approvals?status=pending&limit={limit}");
    for _ in 0..100 {
        let (status, page) = gw.get(reviewer, &path).await;
        assert_eq!(status, 200, "{page}");
        let approvals = page["approvals"].as_array().unwrap();
        assert!(approvals.len() <= limit as usize, "{page}");
        ids.extend(
            approvals
                .iter()
                .map(|a| a["id"].as_str().unwrap().to_owned()),
        );
        match page["next_before"].as_str() {
            Some(next) => {
                path = format!("/v1/approvals?status=pending&limit={limit}&before={next}")
            }
            None => return ids,
        }
    }
    panic!("the listing did not end");
}

#[tokio::test]
async fn a_flood_of_held_requests_cannot_hide_an_older_one() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| {
        config.pending_approvals.per_key = 3;
        config.pending_approvals.per_tenant = 5;
        config.pending_approvals.bytes_per_key = 60_000;
    })
    .await;
    let (_, patient) = gw.key_with_id("agent", "acme", "patient").await;
    let (_, flooder) = gw.key_with_id("agent", "acme", "flooder").await;
    let (_, third) = gw.key_with_id("agent", "acme", "third").await;
    let (_, reviewer) = gw.key_with_id("reviewer", "acme", "alice").await;

    let (status, older) = gw
        .post(&patient, "/v1/executions", &held_body("print('old')"))
        .await;
    assert_eq!(status, 202, "{older}");
    let older = older["approval_id"].as_str().unwrap().to_owned();
    // The flood: three held, then the key's cap answers 429, and the refusal is on record.
    for n in 0..3 {
        let (status, body) = gw
            .post(
                &flooder,
                "/v1/executions",
                &held_body(&format!("print({n})")),
            )
            .await;
        assert_eq!(status, 202, "{body}");
    }
    let (status, refused) = gw
        .post(&flooder, "/v1/executions", &held_body("print(3)"))
        .await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "rate_limited");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("this key already has 3"), "{message}");
    let refused_id = message
        .split("recorded as execution ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("{message}"));
    let (_, record) = gw
        .get(&flooder, &format!("/v1/executions/{refused_id}"))
        .await;
    assert_eq!(record["status"], "denied", "{record}");
    let codes: Vec<&str> = record["decision"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"approval.pending_limit"), "{record}");
    // Stored bytes count too: one large request passes the key's byte cap.
    let big = "#".repeat(70_000);
    let (status, body) = gw.post(&third, "/v1/executions", &held_body(&big)).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("bytes"),
        "{body}"
    );
    // The tenant's cap: a fifth request waits, the sixth of the tenant is refused.
    let (status, _) = gw
        .post(&third, "/v1/executions", &held_body("print(4)"))
        .await;
    assert_eq!(status, 202);
    let (status, body) = gw
        .post(&third, "/v1/executions", &held_body("print(5)"))
        .await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this tenant"),
        "{body}"
    );

    // Small pages, newest first, reach every pending request, the oldest included, once each.
    let ids = all_pending(&gw, &reviewer, 2).await;
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert_eq!(ids.last(), Some(&older), "the oldest comes last: {ids:?}");
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        5,
        "no duplicates: {ids:?}"
    );
    let (status, first) = gw.get(&reviewer, "/v1/approvals?status=pending").await;
    assert_eq!(status, 200);
    assert!(
        first["next_before"].is_null(),
        "one default page holds all: {first}"
    );
    let (status, bad) = gw.get(&reviewer, "/v1/approvals?limit=0").await;
    assert_eq!(status, 400, "{bad}");
    gw.stop().await;
}

#[tokio::test]
async fn spellings_of_the_requesting_principal_cannot_review_its_request() {
    let gw = TestGateway::start().await;
    let (_, agent) = gw.key_with_id("agent", "acme", "a1").await;
    let (_, other) = gw.key_with_id("reviewer", "acme", "a2").await;
    let (status, held) = gw
        .post(&agent, "/v1/executions", &held_body("print(1)"))
        .await;
    assert_eq!(status, 202, "{held}");
    let approval = held["approval_id"].as_str().unwrap().to_owned();
    for spelling in ["a1 ", "A1", " a1", "\u{ff41}\u{ff11}", "a1\u{3000}"] {
        let (_, reviewer) = gw.key_with_id("reviewer", "acme", spelling).await;
        let (status, body) = gw
            .post(
                &reviewer,
                &format!("/v1/approvals/{approval}"),
                &json!({"decision": "approve"}),
            )
            .await;
        assert_eq!(status, 403, "{spelling:?}: {body}");
    }
    assert_eq!(kinds(&gw, "approval.refused").await.len(), 5);

    // The SQL is a second line: a principal stored in another spelling (as before this
    // normalisation, or by another tool) still cannot decide its own request.
    let pool = gw.pool().await;
    let store = AuditStore::new(pool.clone());
    let reason = policy_engine::Reason {
        code: "approval.approved".to_owned(),
        message: "test".to_owned(),
    };
    let verdict = Verdict {
        approve: true,
        reviewer_key_id: "key_someone_else",
        reviewer_principal: " A1 ",
        comment: None,
        instance: "gw_test",
        lease_ms: 30_000,
        reason,
    };
    let event = NewEvent {
        kind: api_types::EventKind::ApprovalApproved,
        execution_id: None,
        key_id: None,
        tenant: None,
        decision_id: None,
        allow: Some(true),
        reasons: json!([]),
        input: json!({}),
        decision: json!({}),
        policy_revision: None,
    };
    let decided = store
        .decide_approval(
            &gateway::ids::ApprovalId::from(approval.as_str()),
            ApprovalSubject::Execution(held["id"].as_str().unwrap()),
            &verdict,
            std::slice::from_ref(&event),
        )
        .await
        .unwrap();
    assert!(
        decided.is_none(),
        "SQL let {:?} decide a1's request",
        verdict.reviewer_principal
    );
    pool.close().await;

    // Another principal may: rejecting runs nothing.
    let (status, body) = gw
        .post(
            &other,
            &format!("/v1/approvals/{approval}"),
            &json!({"decision": "reject"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    gw.stop().await;
}

#[tokio::test]
async fn principals_are_normalised_at_creation_and_bad_ones_refused() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let (status, created) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "reviewer", "tenant": "acme", "principal": "  Ana\u{00A0}RUIZ "}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["principal"], "ana ruiz");
    for bad in ["", "   ", "a\u{200b}1", "a\tb", "\u{202e}a1", "a\u{0}"] {
        let (status, body) = gw
            .post(
                &admin,
                "/v1/keys",
                &json!({"role": "agent", "tenant": "acme", "principal": bad}),
            )
            .await;
        assert_eq!(status, 400, "{bad:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
    }
    gw.stop().await;
}

async fn status_of(gw: &TestGateway, key: &str) -> u16 {
    gw.get(key, "/v1/executions?limit=1").await.0
}

#[tokio::test]
async fn keys_are_listed_revoked_rotated_and_expire_and_each_change_is_audited() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let (status, made) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "agent", "tenant": "acme"}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["tenant_known"], true);
    assert_eq!(made["warnings"], json!([]));
    let (id, secret) = (
        made["id"].as_str().unwrap().to_owned(),
        made["key"].as_str().unwrap().to_owned(),
    );
    assert_eq!(status_of(&gw, &secret).await, 200);

    // Listed, with its last use, never with a secret or hash.
    let (status, page) = gw.get(&admin, "/v1/keys?tenant=acme").await;
    assert_eq!(status, 200, "{page}");
    let listed = &page["keys"].as_array().unwrap()[0];
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["state"], "active");
    assert!(listed["last_used_at"].is_string(), "{listed}");
    assert!(
        !page.to_string().contains(&secret) && !page.to_string().contains("hash"),
        "{page}"
    );
    let (status, _) = gw.get(&secret, "/v1/keys").await;
    assert_eq!(status, 403, "agents do not list keys");

    // Revoked: the very next request is refused.
    let revoked = gw
        .http
        .delete(format!("{}/v1/keys/{id}", gw.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status().as_u16(), 200);
    let revoked: Value = revoked.json().await.unwrap();
    assert_eq!(revoked["state"], "revoked", "{revoked}");
    assert_eq!(status_of(&gw, &secret).await, 401);
    let again = gw
        .http
        .delete(format!("{}/v1/keys/{id}", gw.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 409);
    let unknown = gw
        .http
        .delete(format!("{}/v1/keys/key_0000000000000000", gw.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status().as_u16(), 404);

    // Expiring: works until its time, refused from then on.
    let soon = chrono::Utc::now() + chrono::Duration::seconds(2);
    let (status, expiring) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "agent", "tenant": "acme", "expires_at": soon}),
        )
        .await;
    assert_eq!(status, 201, "{expiring}");
    let expiring_secret = expiring["key"].as_str().unwrap().to_owned();
    assert_eq!(status_of(&gw, &expiring_secret).await, 200);
    let wait = (soon - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(50)).await;
    assert_eq!(status_of(&gw, &expiring_secret).await, 401);
    let (status, bad) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "agent", "tenant": "acme", "expires_at": "2020-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, 400, "{bad}");

    // A tenant the policy data does not know: created, and the answer says so.
    let (status, stray) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "agent", "tenant": "nosuchtenant"}),
        )
        .await;
    assert_eq!(status, 201, "{stray}");
    assert_eq!(stray["tenant_known"], false);
    assert!(
        stray["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not in the policy data"),
        "{stray}"
    );

    // Rotated from the command line: the new key works, the old one is refused at once.
    let (_, rotate_me) = gw.key_with_id("agent", "acme", "rotating").await;
    let rotate_id = format!("key_{}", &rotate_me[4..20]);
    let config = common::test_config(gw.database_url.clone(), gw.data_dir.path());
    let rotated = gateway::cli::keys::rotate_key(&config, &rotate_id, Some("1h"))
        .await
        .unwrap();
    assert_eq!(rotated.principal, "rotating");
    assert_eq!(status_of(&gw, &rotated.secret).await, 200);
    assert_eq!(status_of(&gw, &rotate_me).await, 401);
    assert!(
        gateway::cli::keys::rotate_key(&config, &rotate_id, None)
            .await
            .is_err(),
        "a revoked key does not rotate"
    );
    assert!(gateway::cli::keys::tenant_warning(&config, "nosuchtenant").is_some());
    assert!(gateway::cli::keys::tenant_warning(&config, "acme").is_none());

    // Each change is an audit event.
    let revokes = kinds(&gw, "key.revoke").await;
    assert_eq!(revokes.len(), 1, "{revokes:?}");
    assert_eq!(revokes[0]["key_id"], id.as_str());
    let rotations = kinds(&gw, "key.rotate").await;
    assert_eq!(rotations.len(), 1);
    assert_eq!(rotations[0]["key_id"], rotate_id.as_str());
    assert!(kinds(&gw, "key.create").await.len() >= 4);
    gw.stop().await;
}
