//! A graceful stop pauses the open idle sessions, and the restarted gateway serves them (issue
//! 24 item 3; DESIGN 15): the pause is stored with the session in PostgreSQL, so the new
//! process finds it, and the session's next execution restores it with its variables and
//! files. A session that asked to close when idle is closed `gateway_restart`, as before.
//! Through the real stack: the private experimental dockerd (`snapshots::shared_daemon`), runsc,
//! PostgreSQL.

use crate::common;

use serde_json::json;

use crate::snapshots::{events, gateway_with, run, shared_daemon};

#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_pauses_idle_sessions_and_the_restarted_gateway_resumes_them() {
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let gw = gateway_with(&daemon, url.clone(), tempfile::tempdir().unwrap(), |_| {}).await;
    let agent = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    run(
        &gw,
        &agent,
        &id,
        "x = 41\nopen('/workspace/kept.txt', 'w').write('kept')",
    )
    .await;
    let (status, closing) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "bash", "idle_action": "close"}),
        )
        .await;
    assert_eq!(status, 201, "{closing}");
    let closing = closing["id"].as_str().unwrap().to_owned();
    let instance = gw.instance().await;

    let data_dir = gw.stop_keeping_data().await;
    assert!(
        daemon.containers_of(&instance).is_empty(),
        "the stopped gateway left no container"
    );
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = sqlx::PgPool::connect_with(options).await.unwrap();
    let status_of = |id: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM sessions WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(status_of(id.clone()).await, "paused");
    assert_eq!(status_of(closing.clone()).await, "closed");
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM session_pauses WHERE session_id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 1, "the pause is stored with the session");

    let gw = gateway_with(&daemon, url, data_dir, |_| {}).await;
    assert_eq!(gw.instance().await, instance);
    let seen = gw.session(&agent, &id).await;
    assert_eq!(seen["status"], "paused", "{seen}");
    let read = run(
        &gw,
        &agent,
        &id,
        "(x + 1, open('/workspace/kept.txt').read())",
    )
    .await;
    assert_eq!(read["result"], "(42, 'kept')", "{read}");
    assert_eq!(read["resumed"], true, "{read}");
    let closed = gw.session(&agent, &closing).await;
    assert_eq!(closed["closed_reason"], "gateway_restart", "{closed}");
    assert_eq!(events(&gw, "session.paused", &id).await.len(), 1);
    assert_eq!(events(&gw, "session.resumed", &id).await.len(), 1);
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM session_pauses WHERE session_id = $1")
            .bind(&id)
            .fetch_one(&gw.pool().await)
            .await
            .unwrap();
    assert_eq!(stored, 0, "a resumed session's pause is forgotten");
    gw.stop().await;
}
