//! Sessions on every replica: relayed to the replica holding the sandbox.

use std::time::Duration;

use serde_json::{json, Value};

use super::harness::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_session_opened_on_one_replica_is_used_inspected_and_closed_through_the_other() {
    let shared = Shared::new().await;
    let a = shared.start(None).await;
    let b = shared.start(None).await;
    let agent = shared.key("agent", "acme").await;
    let other_tenant = shared.key("agent", "no-such-tenant").await;

    let (status, opened) = shared
        .post(&a, &agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{opened}");
    let id = opened["id"].as_str().unwrap().to_owned();
    let run = format!("/v1/sessions/{id}/executions");

    // Executions sent to B run in A's sandbox: state carries over, A decides and records.
    let (status, first) = shared
        .post(&b, &agent, &run, &json!({"code": "x = 41"}))
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["instance"], a.instance.as_str(), "{first}");
    let (status, second) = shared
        .post(&b, &agent, &run, &json!({"code": "x + 1"}))
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["result"], "42", "{second}");
    assert_eq!(second["session_id"], id.as_str(), "{second}");
    // The same decision as on A: denied through B, nothing runs, the session goes on.
    let denied_body = json!({"code": "x = 0", "limits": {"timeout_ms": 0}});
    let (status, denied) = shared.post(&b, &agent, &run, &denied_body).await;
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["error"]["code"], "policy_denied", "{denied}");
    let denied_id = denied["error"]["execution_id"].as_str().unwrap().to_owned();
    // Another tenant's agent gets 404 through B too, and nothing is relayed for it.
    let (status, _) = shared
        .post(&b, &other_tenant, &run, &json!({"code": "x"}))
        .await;
    assert_eq!(status, 404);

    // A turn started through B (wait: false): its live events read on B, cancelled through B.
    let slow = json!({"code": "print('slow-one', flush=True)\nimport time\ntime.sleep(60)",
                      "wait": false});
    let (status, started) = shared.post(&b, &agent, &run, &slow).await;
    assert_eq!(status, 202, "{started}");
    let slow_id = started["id"].as_str().unwrap().to_owned();
    let watcher = {
        let (http, url, agent, slow_id) = (
            shared.http.clone(),
            b.url.clone(),
            agent.clone(),
            slow_id.clone(),
        );
        tokio::spawn(async move {
            let mut response = http
                .get(format!("{url}/v1/executions/{slow_id}/events"))
                .bearer_auth(&agent)
                .send()
                .await
                .unwrap();
            let mut text = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            text
        })
    };
    let mut running = Value::Null;
    for _ in 0..200 {
        running = shared
            .get(&b, &agent, &format!("/v1/sessions/{id}"))
            .await
            .1;
        if running["status"] == "busy" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(running["status"], "busy", "{running}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancel = format!("/v1/executions/{slow_id}/cancel");
    let (status, cancelled) = shared.post(&b, &agent, &cancel, &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let seen = tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .unwrap()
        .unwrap();
    assert!(
        seen.contains("slow-one"),
        "live output relayed to B: {seen}"
    );
    assert!(seen.contains("event: exit"), "{seen}");
    let (_, after) = shared.post(&b, &agent, &run, &json!({"code": "x"})).await;
    assert_eq!(
        after["result"], "41",
        "the session lives on after the cancel: {after}"
    );

    // Inspected on B: the shared row, counting what ran through B.
    let (status, seen_on_b) = shared.get(&b, &agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{seen_on_b}");
    assert_eq!(seen_on_b["status"], "ready", "{seen_on_b}");
    assert_eq!(seen_on_b["executions"], 4, "{seen_on_b}");
    let container = seen_on_b["container"].as_str().unwrap().to_owned();

    // Closed through B: A removes its sandbox, the record says `deleted`.
    let (status, closed) = shared
        .delete(&b, &agent, &format!("/v1/sessions/{id}"))
        .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["status"], "closed", "{closed}");
    assert_eq!(closed["closed_reason"], "deleted", "{closed}");
    let (status, gone) = shared.post(&b, &agent, &run, &json!({"code": "x"})).await;
    assert_eq!(status, 409, "{gone}");
    assert!(
        container_gone(&container).await,
        "the session's container {container} is still there"
    );

    // Every relayed execution was decided once, on A, before it ran.
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let ids = [
        first["id"].as_str().unwrap().to_owned(),
        second["id"].as_str().unwrap().to_owned(),
        denied_id,
        slow_id,
    ];
    let decided: Vec<(String, i64, Option<String>)> = sqlx::query_as(
        "SELECT e.id, (SELECT count(*) FROM audit_events v WHERE v.kind = 'execution.decision' \
         AND v.execution_id = e.id), e.instance FROM executions e WHERE e.id = ANY($1)",
    )
    .bind(&ids[..])
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(decided.len(), 4, "{decided:?}");
    for (execution, events, instance) in &decided {
        assert_eq!(*events, 1, "{execution}: one decision event");
        assert_eq!(
            instance.as_deref(),
            Some(a.instance.as_str()),
            "{execution}"
        );
    }
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM session_turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(waiting, 0, "answered relays leave no row");

    // A session held by a replica that does not answer: 503 within the bound, never a hang.
    let held_elsewhere = "ss_held_by_a_silent_replica";
    sqlx::query(
        "INSERT INTO sessions (id, tenant, key_id, language, status, decision, limits, \
         idle_timeout_s, ttl_s, instance, created_at, last_used_at, expires_at, lease_until) \
         SELECT $1, tenant, key_id, language, 'ready', decision, limits, idle_timeout_s, ttl_s, \
         'silent-replica', now(), now(), now() + interval '1 hour', now() + interval '1 hour' \
         FROM sessions WHERE id = $2",
    )
    .bind(held_elsewhere)
    .bind(&id)
    .execute(&pool)
    .await
    .unwrap();
    let asked = std::time::Instant::now();
    let path = format!("/v1/sessions/{held_elsewhere}/executions");
    let (status, refused) = shared.post(&b, &agent, &path, &json!({"code": "1"})).await;
    assert_eq!(status, 503, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("silent-replica"), "{message}");
    assert!(asked.elapsed() < Duration::from_secs(30), "bounded");
    pool.close().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_whose_replica_died_is_closed_by_the_other_and_refused_there() {
    let shared = Shared::new().await;
    let mut a = shared.start(None).await;
    let b = shared.start(None).await;
    let agent = shared.key("agent", "acme").await;
    let (status, opened) = shared
        .post(&a, &agent, "/v1/sessions", &json!({"language": "bash"}))
        .await;
    assert_eq!(status, 201, "{opened}");
    let id = opened["id"].as_str().unwrap().to_owned();
    let container = opened["container"].as_str().unwrap().to_owned();
    let run = format!("/v1/sessions/{id}/executions");
    let (status, ran) = shared
        .post(&b, &agent, &run, &json!({"code": "echo hi"}))
        .await;
    assert_eq!(status, 200, "{ran}");

    // A dies: a request relayed to it is not taken, and once the lease has expired the
    // session is closed by B (`lease_expired`): the request ends 409, not a hang.
    a.kill();
    let asked = std::time::Instant::now();
    let (status, refused) = shared
        .post(&b, &agent, &run, &json!({"code": "echo no"}))
        .await;
    assert!(asked.elapsed() < Duration::from_secs(30), "bounded");
    assert_eq!(status, 409, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("lease_expired"), "{message}");
    let (_, closed) = shared.get(&b, &agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(closed["status"], "closed", "{closed}");
    assert_eq!(closed["closed_reason"], "lease_expired", "{closed}");
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'session.closed' \
         AND input->>'session_id' = $1 AND input->>'closed_by' = $2",
    )
    .bind(&id)
    .bind(&b.instance)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(events, 1, "B's session.closed event");
    let (status, _) = shared
        .delete(&b, &agent, &format!("/v1/sessions/{id}"))
        .await;
    assert_eq!(status, 200, "deleting a closed session is fine");

    // A comes back: its reaper removes the sandbox, and the session stays closed.
    let a = shared.start(Some(&a.data)).await;
    assert!(
        container_gone(&container).await,
        "the dead replica's session container {container} is still there"
    );
    let (_, after) = shared.get(&a, &agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(after["closed_reason"], "lease_expired", "{after}");
    pool.close().await;
    a.stop().await;
    b.stop().await;
}
