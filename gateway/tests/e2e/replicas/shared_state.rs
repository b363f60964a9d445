//! What replicas share besides sessions: policy revisions, purges, event ids.

use std::time::Duration;

use serde_json::{json, Value};

use super::common;
use super::harness::*;

/// Runs a program on `at` that leaves `/output/old.txt`; its id and where `at` collected it.
async fn collected_run(shared: &Shared, at: &Replica, key: &str) -> (String, std::path::PathBuf) {
    let body = json!({"language": "bash", "code": "echo -n old > /output/old.txt", "wait": true});
    let (status, record) = shared.post(at, key, "/v1/executions", &body).await;
    assert_eq!(status, 200, "{record}");
    let id = record["id"].as_str().unwrap().to_owned();
    let collected = at.data.join("outputs").join(&id);
    assert!(
        collected.join("old.txt").is_file(),
        "collected on the disk of {}",
        at.instance
    );
    (id, collected)
}

/// Moves `id`'s end past a 30-day retention, then starts a replica that purges at start.
async fn purged_by_a_new_replica(shared: &Shared, pool: &sqlx::PgPool, id: &str) -> Replica {
    sqlx::query("UPDATE executions SET finished_at = now() - interval '40 days' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    let purger = shared
        .start_with(None, &[("SANDGATE_RETENTION_DAYS", "30")])
        .await;
    let mut purged = false;
    for _ in 0..100 {
        purged = sqlx::query_scalar("SELECT purged_at IS NOT NULL FROM executions WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        if purged {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(purged, "{} did not purge {id}", purger.instance);
    purger
}

/// Waits until `path` is gone.
async fn removed(path: &std::path::Path) -> bool {
    for _ in 0..200 {
        if !path.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_purge_on_one_replica_removes_the_files_the_other_collected() {
    let shared = Shared::new().await;
    // A never purges by itself: what goes from its disk, another replica's purge removed.
    let a_env = [("SANDGATE_RETENTION_DAYS", "0")];
    let a = shared.start_with(None, &a_env).await;
    let agent = shared.key("agent", "acme").await;
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let (first, first_files) = collected_run(&shared, &a, &agent).await;
    let (second, second_files) = collected_run(&shared, &a, &agent).await;

    // Purged by B while A runs: A removes its files.
    let b = purged_by_a_new_replica(&shared, &pool, &first).await;
    assert!(
        removed(&first_files).await,
        "A's files of {first} are still on its disk"
    );
    assert!(second_files.exists(), "only what was purged goes");
    let (status, refused) = shared
        .get(
            &a,
            &agent,
            &format!("/v1/executions/{first}/outputs/old.txt"),
        )
        .await;
    assert_eq!(status, 404, "{refused}");
    b.stop().await;

    // Purged by C while A is down (it hears nothing): A removes its files when it is back.
    let data = a.data.clone();
    a.stop().await;
    let c = purged_by_a_new_replica(&shared, &pool, &second).await;
    assert!(second_files.exists());
    let a = shared.start_with(Some(&data), &a_env).await;
    assert!(
        removed(&second_files).await,
        "A's files of {second} are still on its disk"
    );
    pool.close().await;
    a.stop().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_stream_read_on_one_replica_resumes_on_the_other_with_the_same_ids() {
    let shared = Shared::new().await;
    let a = shared.start(None).await;
    let b = shared.start(None).await;
    let agent = shared.key("agent", "acme").await;
    let code = "echo one; sleep 2; echo two; sleep 2; echo three; sleep 1";
    let body = json!({"language": "bash", "code": code, "wait": false});
    let (_, started) = shared.post(&a, &agent, "/v1/executions", &body).await;
    let id = started["id"].as_str().unwrap().to_owned();
    let events = format!("/v1/executions/{id}/events");

    // On A, live: read until the first event, then the connection drops.
    let mut on_a = shared
        .http
        .get(format!("{}{events}", a.url))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while sse_blocks(&text).is_empty() {
        let chunk = on_a.chunk().await.unwrap().expect("the stream ended early");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(on_a);
    let first = sse_blocks(&text);
    assert_eq!(first[0].1, "stdout", "{text}");
    assert_eq!(first[0].2["text"], "one\n", "{text}");
    let last_id = first.last().unwrap().0;

    // Resumed on B with A's id while it still runs: the rest, under A's ids.
    let (_, record) = shared
        .get(&b, &agent, &format!("/v1/executions/{id}"))
        .await;
    assert!(record["finished_at"].is_null(), "still running: {record}");
    let resumed = shared
        .http
        .get(format!("{}{events}", b.url))
        .bearer_auth(&agent)
        .header("last-event-id", last_id.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status().as_u16(), 200);
    let rest = sse_blocks(&resumed.text().await.unwrap());
    let stdout: String = rest
        .iter()
        .filter(|(_, name, _)| name == "stdout")
        .map(|(_, _, data)| data["text"].as_str().unwrap())
        .collect();
    assert_eq!(stdout, "two\nthree\n", "{rest:?}");
    assert_eq!(rest.last().unwrap().1, "exit", "{rest:?}");

    // The ids B gave are those A gives (A's replay of the stored record follows its layout).
    let all_on_a = shared
        .http
        .get(format!("{}{events}", a.url))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let all_on_a = sse_blocks(&all_on_a);
    let expected: Vec<_> = all_on_a
        .iter()
        .filter(|(n, _, _)| *n > last_id)
        .map(|(n, name, data)| (*n, name.clone(), data["text"].clone()))
        .collect();
    let got: Vec<_> = rest
        .iter()
        .map(|(n, name, data)| (*n, name.clone(), data["text"].clone()))
        .collect();
    assert_eq!(got, expected, "B's ids and events are A's");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bundle_uploaded_to_one_replica_is_loaded_and_decided_with_by_the_other() {
    let shared = Shared::new().await;
    let a = shared.start(None).await;
    let b = shared.start(None).await;
    let admin = shared.key("admin", "ops").await;
    let agent = shared.key("agent", "acme").await;

    // A bundle no policy_dir holds: acme may no longer run bash (its own cases, which say it
    // may, left out).
    let candidate = common::copy_of_shipped();
    std::fs::remove_dir_all(candidate.path().join("tests")).unwrap();
    let tenants = candidate.path().join("data/tenants.yaml");
    let text = std::fs::read_to_string(&tenants).unwrap();
    assert!(text.contains("languages: [python, bash]"));
    std::fs::write(
        &tenants,
        text.replacen("languages: [python, bash]", "languages: [python]", 1),
    )
    .unwrap();
    let bundle = gateway::app::policy_upload::pack(candidate.path()).unwrap();
    let uploaded = shared
        .http
        .post(format!("{}/v1/policy/reload", a.url))
        .bearer_auth(&admin)
        .header("content-type", "application/gzip")
        .body(bundle)
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status().as_u16(), 200);
    let uploaded: Value = uploaded.json().await.unwrap();
    let revision = uploaded["revision"].as_str().unwrap().to_owned();

    // B loads it from the stored files: /readyz shows both on it, without an error.
    let seen = readyz_until(&shared, &b, &[&a.instance, &b.instance], &revision).await;
    let rows = seen["replicas"].as_array().cloned().unwrap_or_default();
    for instance in [&a.instance, &b.instance] {
        assert!(
            rows.iter().any(|row| row["instance"] == instance.as_str()
                && row["policy_revision"] == revision.as_str()
                && row["policy_error"].is_null()),
            "{instance} does not run {revision}: {seen}"
        );
    }
    // ... and decides with it.
    let body = json!({"language": "bash", "code": "echo no", "wait": true});
    let (status, denied) = shared.post(&b, &agent, "/v1/executions", &body).await;
    assert_eq!(status, 403, "{denied}");
    let reasons = denied["error"]["reasons"].to_string();
    assert!(reasons.contains("language.not_allowed"), "{denied}");
    let id = denied["error"]["execution_id"].as_str().unwrap();
    let (_, record) = shared
        .get(&b, &agent, &format!("/v1/executions/{id}"))
        .await;
    assert_eq!(
        record["decision"]["policy_revision"],
        revision.as_str(),
        "{record}"
    );
    assert_eq!(record["instance"], b.instance.as_str(), "{record}");

    // A revision no replica can load (no files stored for it): each says why, and keeps its own.
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    sqlx::query("SELECT pg_notify('sandgate_policy', $1)")
        .bind(json!({"revision": "no-such-revision", "by": "elsewhere"}).to_string())
        .execute(&pool)
        .await
        .unwrap();
    let mut errors = Vec::new();
    for _ in 0..100 {
        let ready: Value = shared
            .http
            .get(format!("{}/readyz", a.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        errors = ready["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|row| row["policy_error"].is_string())
            .collect();
        if errors.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(errors.len(), 2, "{errors:?}");
    for row in &errors {
        let error = row["policy_error"].as_str().unwrap();
        assert!(error.contains("no-such-revision"), "{error}");
        assert!(error.contains("no files"), "{error}");
        assert_eq!(row["policy_revision"], revision.as_str(), "{row}");
    }
    pool.close().await;
    a.stop().await;
    b.stop().await;
}
