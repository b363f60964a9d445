//! Fail closed: when the audit store cannot commit a decision, the API answers 503 and no
//! container is created. These tests create no containers on the success path, so a
//! create event for any sandgate container during them is a failure.

use crate::common;

use serde_json::json;

use common::{containers_created_since, test_config, TestGateway};
use gateway::database::EmbeddedPostgres;

#[tokio::test(flavor = "multi_thread")]
async fn postgres_stopped_gives_503_and_runs_nothing() {
    // The embedded default: no database URL, a private cluster under the data dir.
    let gw = TestGateway::start_with(None, |_| {}).await;
    let config = test_config(None, gw.data_dir.path());
    let key = gateway::cli::keys::create_key(&config, "agent", "acme")
        .await
        .unwrap();
    let health = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);

    // Stop the server under the gateway, as a crash would.
    let label = format!("sandgate.instance={}", gw.instance().await);
    let pg = EmbeddedPostgres::start(gw.data_dir.path(), None).unwrap();
    assert!(
        !pg.owned(),
        "the gateway's cluster should have been running"
    );
    pg.stop_now("immediate").unwrap();

    let since = common::docker_now();
    let (status, body) = gw
        .execute(&key.secret, "python", "print(1)", json!({}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
    assert!(
        containers_created_since(&since, &label).is_empty(),
        "a container was created although nothing could be audited"
    );
    let ready = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(ready["missing"], json!(["postgres"]), "{ready}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_audit_write_gives_503_and_runs_nothing() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let pool = gw.pool().await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_insert() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'simulated: no space left on device'; END; $$; \
         CREATE TRIGGER refuse_insert BEFORE INSERT ON audit_events \
         FOR EACH ROW EXECUTE FUNCTION refuse_insert();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let label = format!("sandgate.instance={}", gw.instance().await);
    let since = common::docker_now();
    let (status, body) = gw.execute(&key, "python", "print(1)", json!({})).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
    assert!(
        !body.to_string().contains("simulated"),
        "database text must not reach the client: {body}"
    );
    assert!(
        containers_created_since(&since, &label).is_empty(),
        "a container was created although its decision was not committed"
    );
    // The execution row rolled back with its event: nothing half-recorded.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM executions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    gw.stop().await;
}
