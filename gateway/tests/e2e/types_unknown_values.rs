//! A stored status or role outside its closed set (as a newer version, or a hand edit, could
//! leave it): the row is not read as any other value. The API answers 500 `internal` for it
//! (a record is not shown as `error`, a key with an unknown role is not let in), and
//! `sandgate_store_unknown_values_total{column}` counts each refusal.

use crate::common;

use serde_json::json;

use common::TestGateway;

/// `sandgate_store_unknown_values_total{column="<column>"}` as `/metrics` shows it.
async fn unknown_values(gw: &TestGateway, admin: &str, column: &str) -> f64 {
    let text = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("sandgate_store_unknown_values_total{{column=\"{column}\"}} ");
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series}in\n{text}"));
    line.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_stored_statuses_and_roles_fail_closed_and_are_counted() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let agent = gw.key("agent", "acme").await;
    let (status, denied) = gw.execute(&agent, "cobol", "x", json!({})).await;
    assert_eq!(status, 403, "{denied}");
    let id = denied["error"]["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(unknown_values(&gw, &admin, "executions.status").await, 0.0);

    // A status this version does not know (the CHECK constraint is what a newer one widens).
    let pool = gw.pool().await;
    sqlx::query("ALTER TABLE executions DROP CONSTRAINT executions_status_check")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE executions SET status = 'paused' WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    let (status, body) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    assert!(!body.to_string().contains("paused"), "{body}");
    let (status, body) = gw.get(&agent, "/v1/executions").await;
    assert_eq!(
        status, 500,
        "a listing does not show it as another status: {body}"
    );
    assert_eq!(unknown_values(&gw, &admin, "executions.status").await, 2.0);

    // A key whose role is none: refused, not let in as "no role".
    let other = gw.key("agent", "acme").await;
    let other_id = format!("key_{}", &other[4..20]);
    sqlx::query("ALTER TABLE api_keys DROP CONSTRAINT api_keys_role_check")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE api_keys SET role = 'operator' WHERE id = $1")
        .bind(&other_id)
        .execute(&pool)
        .await
        .unwrap();
    let (status, body) = gw.get(&other, "/v1/me").await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    assert_eq!(unknown_values(&gw, &admin, "api_keys.role").await, 1.0);
    assert_eq!(unknown_values(&gw, &admin, "sessions.status").await, 0.0);
    pool.close().await;
    gw.stop().await;
}
