//! The remaining stored texts of a closed set under the one rule of `audit::unknown_value`
//! (`executions.start`, `sessions.start`, `session_turns.kind`, `session_turns.error_code`): a
//! value this version does not know (a newer version's, or a hand edit) is never read as another
//! one. The API answers 500 `internal`, a relayed request is not run, and
//! `sandgate_store_unknown_values_total{column}` counts each refusal.

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::common::{self, TestGateway};
use crate::unknown_values::{counted, refused, store, widen};

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_execution_start_fails_closed_and_is_counted() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let agent = gw.key("agent", "acme").await;
    let (status, record) = gw.execute(&agent, "python", "print(1)", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert!(
        record["start"] == "warm" || record["start"] == "cold",
        "{record}"
    );
    let id = record["id"].as_str().unwrap().to_owned();
    let before = counted(&gw, &admin, "executions.start").await;

    let pool = gw.pool().await;
    widen(&pool, "executions", "executions_start_check").await;
    store(&pool, "executions", "start", &id, "lukewarm").await;
    refused(&gw, &agent, &format!("/v1/executions/{id}"), &["lukewarm"]).await;
    refused(&gw, &agent, "/v1/executions", &["lukewarm"]).await;
    assert_eq!(counted(&gw, &admin, "executions.start").await, before + 2.0);
    pool.close().await;
    gw.stop().await;
}

/// Waits until `column`'s count is `before + 1`.
async fn counted_once(gw: &TestGateway, admin: &str, column: &str, before: f64) {
    common::eventually(Duration::from_secs(10), column, || async {
        counted(gw, admin, column).await == before + 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_session_start_or_relayed_turn_fails_closed_and_is_counted() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let (key_id, agent) = gw.key_with_id("agent", "acme", "ana").await;
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    let started = session["start"].as_str().unwrap().to_owned();
    let pool = gw.pool().await;

    let before = counted(&gw, &admin, "sessions.start").await;
    widen(&pool, "sessions", "sessions_start_check").await;
    store(&pool, "sessions", "start", &id, "tepid").await;
    refused(&gw, &agent, &format!("/v1/sessions/{id}"), &["tepid"]).await;
    assert_eq!(counted(&gw, &admin, "sessions.start").await, before + 1.0);
    store(&pool, "sessions", "start", &id, &started).await;

    unknown_turn_kind(&gw, &pool, &admin, &id, &key_id).await;
    unknown_turn_error(&gw, &pool, &admin, &agent, &id).await;

    let (status, closed) = gw.delete(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{closed}");
    pool.close().await;
    gw.stop().await;
}

/// A request relayed to this replica whose kind it does not know: its claim does not read the
/// row, so nothing runs (no execution, no answer).
async fn unknown_turn_kind(gw: &TestGateway, pool: &PgPool, admin: &str, session: &str, key: &str) {
    let instance = gw.instance().await;
    let before = counted(gw, admin, "session_turns.kind").await;
    widen(pool, "session_turns", "session_turns_kind_check").await;
    sqlx::query(
        "INSERT INTO session_turns (id, session_id, owner, asked_by, key_id, kind, request) \
         VALUES ('tr_teleport', $1, $2, 'elsewhere', $3, 'teleport', '{}'::jsonb)",
    )
    .bind(session)
    .bind(&instance)
    .bind(key)
    .execute(pool)
    .await
    .unwrap();
    let message = json!({"turn": "tr_teleport", "to": instance}).to_string();
    sqlx::query("SELECT pg_notify('sandgate_turn', $1)")
        .bind(&message)
        .execute(pool)
        .await
        .unwrap();
    counted_once(gw, admin, "session_turns.kind", before).await;
    let (answered, executions): (Option<chrono::DateTime<chrono::Utc>>, i64) = sqlx::query_as(
        "SELECT t.answered_at, s.executions FROM session_turns t \
         JOIN sessions s ON s.id = t.session_id WHERE t.id = 'tr_teleport'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((answered, executions), (None, 0), "the turn was not run");
    sqlx::query("DELETE FROM session_turns WHERE id = 'tr_teleport'")
        .execute(pool)
        .await
        .unwrap();
}

/// A copy of session `id`'s row, open on another replica (`elsewhere`): this one relays what is
/// asked of it.
async fn held_elsewhere(pool: &PgPool, id: &str) -> String {
    let copy = format!("{id}_elsewhere");
    sqlx::query(
        "INSERT INTO sessions SELECT * FROM jsonb_populate_record(NULL::sessions,          (SELECT to_jsonb(s) || jsonb_build_object('id', $2::text, 'instance', 'elsewhere',          'container', NULL) FROM sessions s WHERE id = $1))",
    )
    .bind(id)
    .bind(&copy)
    .execute(pool)
    .await
    .unwrap();
    copy
}

/// This replica relays an execution to a session's owner, which answers with an error code this
/// version does not know: the caller gets 500 `internal`, not another refusal.
async fn unknown_turn_error(gw: &TestGateway, pool: &PgPool, admin: &str, agent: &str, id: &str) {
    let instance = gw.instance().await;
    let before = counted(gw, admin, "session_turns.error_code").await;
    widen(pool, "session_turns", "session_turns_error_code_check").await;
    let id = held_elsewhere(pool, id).await;
    let run = gw
        .http
        .post(format!("{}/v1/sessions/{id}/executions", gw.url))
        .bearer_auth(agent)
        .json(&json!({"code": "print(2)"}))
        .send();
    let asking = tokio::spawn(async move {
        let response = run.await.unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    });
    let turn: String = common::until(Duration::from_secs(4), "the relayed run", || async {
        sqlx::query_scalar(
            "SELECT id FROM session_turns WHERE session_id = $1 AND kind = 'execute'",
        )
        .bind(&id)
        .fetch_optional(pool)
        .await
        .unwrap()
    })
    .await;
    sqlx::query(
        "UPDATE session_turns SET picked_at = now(), answered_at = now(), \
         error_code = 'teapot', error = 'short and stout' WHERE id = $1",
    )
    .bind(&turn)
    .execute(pool)
    .await
    .unwrap();
    let message = json!({"turn": turn, "to": instance}).to_string();
    sqlx::query("SELECT pg_notify('sandgate_turn_news', $1)")
        .bind(&message)
        .execute(pool)
        .await
        .unwrap();
    let (status, body) = asking.await.unwrap();
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    assert!(!body.to_string().contains("teapot"), "{body}");
    assert_eq!(
        counted(gw, admin, "session_turns.error_code").await,
        before + 1.0
    );
    sqlx::query(
        "UPDATE sessions SET status = 'closed', closed_reason = 'deleted', closed_at = now() \
         WHERE id = $1",
    )
    .bind(&id)
    .execute(pool)
    .await
    .unwrap();
}
