//! `max_sessions` across replicas (issue 21, item 5): two real `sandgate serve` processes on one
//! PostgreSQL database and the same dockerd; eight concurrent opens spread over both, with
//! `max_sessions: 2`, open exactly two sessions (the count and the insert are one step under the
//! tenant's advisory lock in the shared database, not a count of what one replica holds).

use crate::replicas::harness;

use futures_util::future::join_all;
use serde_json::json;

use harness::Shared;

#[tokio::test(flavor = "multi_thread")]
async fn eight_concurrent_opens_over_two_replicas_open_exactly_two() {
    let shared = Shared::new().await;
    let env = [("SANDGATE_MAX_SESSIONS", "2")];
    let a = shared.start_with(None, &env).await;
    let b = shared.start_with(None, &env).await;
    let agent = shared.key("agent", "acme").await;
    let body = json!({"language": "bash"});
    let opens = (0..8).map(|i| {
        let at = if i % 2 == 0 { &a } else { &b };
        shared.post(at, &agent, "/v1/sessions", &body)
    });
    let answers = join_all(opens).await;
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        2,
        "{statuses:?}: {answers:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 429),
        "{statuses:?}"
    );
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE status <> 'closed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(open, 2);
    for (status, session) in &answers {
        if *status == 201 {
            let id = session["id"].as_str().unwrap();
            let (status, closed) = shared
                .delete(&b, &agent, &format!("/v1/sessions/{id}"))
                .await;
            assert_eq!(status, 200, "{closed}");
        }
    }
    a.stop().await;
    b.stop().await;
}
