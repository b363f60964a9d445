//! A replica's stale copy of a paused session (docs/snapshots.md "Replicas"): a replica that
//! once registered another replica's paused session (a snapshot it refused, over quota) must
//! not, after that session was resumed and paused again elsewhere, restore its old checkpoint
//! and store it back as the session's pause (the new checkpoint orphaned). It restores the
//! pause it claims in PostgreSQL.

use serde_json::json;

use crate::replicas::harness::{Replica, Shared};
use crate::snapshots::shared_daemon;

const SETUP: &str = "x = 41";
const READ: &str = "x + 1";

async fn start(shared: &Shared, env: &[(&str, String)]) -> Replica {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    shared.start_with(None, &env).await
}

async fn step(shared: &Shared, at: &Replica, agent: &str, id: &str, what: &str) -> u16 {
    let path = format!("/v1/sessions/{id}/{what}");
    shared.post(at, agent, &path, &json!({})).await.0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_resumes_the_pause_it_claims_not_an_old_copy() {
    let daemon = shared_daemon().await;
    let shared = Shared::new().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("unix://{}", daemon.socket().display());
    let snapshots = |quota: &str| {
        vec![
            ("DOCKER_HOST", socket.clone()),
            (
                "SANDGATE_SNAPSHOTS",
                format!("{{enabled: true, dir: {}{quota}}}", dir.path().display()),
            ),
        ]
    };
    let a = start(&shared, &snapshots("")).await;
    // B keeps no snapshots: its snapshot requests are refused over quota.
    let b = start(&shared, &snapshots(", max_bytes_per_tenant: 0")).await;
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let agent = shared.key("agent", "acme").await;
    let (status, session) = shared
        .post(&a, &agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sessions/{id}/executions");
    let (status, record) = shared
        .post(&a, &agent, &path, &json!({"code": SETUP}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(step(&shared, &a, &agent, &id, "pause").await, 200);

    // Refused on B while paused on A (its first checkpoint).
    let snapshot = format!("/v1/sessions/{id}/snapshots");
    let (status, refused) = shared.post(&b, &agent, &snapshot, &json!({})).await;
    assert_eq!(status, 429, "{refused}");
    // A resumes it (the first image is consumed) and pauses it again: a second checkpoint.
    assert_eq!(step(&shared, &a, &agent, &id, "resume").await, 200);
    assert_eq!(step(&shared, &a, &agent, &id, "pause").await, 200);

    // Resumed through B, it is the second checkpoint that is restored, with the state.
    assert_eq!(step(&shared, &b, &agent, &id, "resume").await, 200);
    let (status, read) = shared.post(&b, &agent, &path, &json!({"code": READ})).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["result"], "42", "{read}");
    let (status, instance): (String, String) =
        sqlx::query_as("SELECT status, instance FROM sessions WHERE id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), instance.as_str()),
        ("ready", b.instance.as_str())
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM session_pauses WHERE session_id = $1")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "a pause left behind");
    a.stop().await;
    b.stop().await;
}
