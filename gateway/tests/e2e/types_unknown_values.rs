//! A stored status or role outside its closed set (as a newer version, or a hand edit, could
//! leave it): the row is not read as any other value. The API answers 500 `internal` for it
//! (a record is not shown as `error`, a key with an unknown role is not let in), and
//! `sandgate_store_unknown_values_total{column}` counts each refusal.

use crate::common;
use crate::unknown_values::{counted as unknown_values, refused, store, widen};

use serde_json::json;

use common::TestGateway;

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
    widen(&pool, "executions", "executions_status_check").await;
    store(&pool, "executions", "status", &id, "paused").await;
    refused(&gw, &agent, &format!("/v1/executions/{id}"), &["paused"]).await;
    // A listing does not show it as another status either.
    refused(&gw, &agent, "/v1/executions", &["paused"]).await;
    assert_eq!(unknown_values(&gw, &admin, "executions.status").await, 2.0);

    // A key whose role is none: refused, not let in as "no role".
    let other = gw.key("agent", "acme").await;
    let other_id = format!("key_{}", &other[4..20]);
    widen(&pool, "api_keys", "api_keys_role_check").await;
    store(&pool, "api_keys", "role", &other_id, "operator").await;
    refused(&gw, &other, "/v1/me", &["operator"]).await;
    assert_eq!(unknown_values(&gw, &admin, "api_keys.role").await, 1.0);
    assert_eq!(unknown_values(&gw, &admin, "sessions.status").await, 0.0);
    pool.close().await;
    gw.stop().await;
}
