//! Two replicas (DESIGN 13): two real `sandgate serve` processes, each with its own data
//! directory and instance id, on one PostgreSQL database and the same dockerd.
//!
//! - Mixed requests spread over both (runs, denials, approvals decided on the other replica,
//!   cancels through the other, live events and outputs read from the other); afterwards the
//!   chain verifies, every execution has exactly one decision event, no container is left, and
//!   a reload on one replica is seen by both.
//! - SIGKILL of one replica mid-run: the other closes its record once the lease expired (short
//!   leases through config), a watcher on the survivor sees the end, the container is left
//!   alone until the killed replica comes back and its reaper removes it, and the record stays
//!   closed.
//! - A session opened on one replica is used (decided and run on its owner), followed, cancelled,
//!   inspected and closed through the other; a replica that does not take a relayed request
//!   answers 503 within the bound; a session whose replica died is closed (`lease_expired`).
//! - A bundle uploaded to one replica is loaded by the other from the stored files and decides
//!   there; a revision nobody can load is reported by each replica in `/readyz`.
//! - A purge on one replica removes the files the other collected.
//! - A live stream read on one replica resumes on the other with the same event ids.
//!
//! Every replica is killed when its `Replica` is dropped, so a failing test leaves none behind.

use crate::common;
pub(crate) mod harness;
mod sessions;
mod shared_state;

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use harness::{container_started, no_container_left, Shared, LEASE_MS};

/// A program that prints, waits (so it is still running when watched), prints again.
const TICKS: &str = "echo tick-one; sleep 3; echo tick-two";
/// A destination acme's allowlist does not cover: the shipped policy holds it for review.
fn review_network() -> Value {
    json!([{"host": "review.example", "port": 443}])
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_answer_every_route_and_keep_one_verifiable_chain() {
    let shared = Shared::new().await;
    let a = shared.start(None).await;
    let b = shared.start(None).await;
    assert_ne!(a.instance, b.instance);
    let agent = shared.key("agent", "acme").await;
    let stranger = shared.key("agent", "no-such-tenant").await;
    let reviewer = shared.key("reviewer", "review-desk").await;
    let auditor = shared.key("auditor", "audit-desk").await;
    let admin = shared.key("admin", "ops").await;
    let replicas = [&a, &b];
    let other = |i: usize| replicas[(i + 1) % 2];
    let mut ids: Vec<String> = Vec::new();

    // 24 runs and 12 denials, spread over both replicas, at once.
    let runs = (0..36).map(|i| {
        let (at, key) = if i < 24 {
            (replicas[i % 2], &agent)
        } else {
            (replicas[i % 2], &stranger)
        };
        let body = json!({"language": "bash", "code": format!("echo run-{i}"), "wait": true});
        let shared = &shared;
        async move {
            (
                i,
                at.instance.clone(),
                shared.post(at, key, "/v1/executions", &body).await,
            )
        }
    });
    for (i, instance, (status, record)) in join_all(runs).await {
        let id = record["id"]
            .as_str()
            .or(record["error"]["execution_id"].as_str());
        ids.push(id.unwrap_or_else(|| panic!("{status} {record}")).to_owned());
        if i < 24 {
            assert_eq!(status, 200, "{record}");
            assert_eq!(record["stdout"], format!("run-{i}\n"), "{record}");
            assert_eq!(record["instance"], instance, "{record}");
        } else {
            assert_eq!(status, 403, "{record}");
            assert_eq!(record["error"]["code"], "policy_denied", "{record}");
        }
    }

    // 8 held for review on one replica, each approved on the other: it runs there.
    for i in 0..8 {
        let body = json!({"language": "bash", "code": format!("echo reviewed-{i}"),
                          "network": review_network(), "wait": false});
        let (status, held) = shared
            .post(replicas[i % 2], &agent, "/v1/executions", &body)
            .await;
        assert_eq!(status, 202, "{held}");
        let id = held["id"].as_str().unwrap().to_owned();
        let approval = held["approval_id"].as_str().unwrap();
        let path = format!("/v1/approvals/{approval}");
        let (status, decided) = shared
            .post(other(i), &reviewer, &path, &json!({"decision": "approve"}))
            .await;
        assert_eq!(status, 200, "{decided}");
        let record = shared.finished(replicas[i % 2], &agent, &id).await;
        assert_eq!(record["status"], "succeeded", "{record}");
        assert_eq!(record["stdout"], format!("reviewed-{i}\n"), "{record}");
        assert_eq!(
            record["instance"],
            other(i).instance,
            "runs where it was approved"
        );
        ids.push(id);
    }

    // 8 long runs, each cancelled through the other replica.
    for i in 0..8 {
        let body = json!({"language": "bash", "code": "sleep 30", "wait": false});
        let (_, started) = shared
            .post(replicas[i % 2], &agent, "/v1/executions", &body)
            .await;
        let id = started["id"].as_str().unwrap().to_owned();
        container_started(&id).await;
        let path = format!("/v1/executions/{id}/cancel");
        let (status, cancelled) = shared.post(other(i), &agent, &path, &json!({})).await;
        assert_eq!(status, 200, "{cancelled}");
        assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
        ids.push(id);
    }

    // 8 runs whose live events are read from the other replica while they run.
    let watched = (0..8).map(|i| {
        let shared = &shared;
        let agent = &agent;
        async move {
            let body = json!({"language": "bash", "code": TICKS, "wait": false});
            let (_, started) = shared
                .post(replicas[i % 2], agent, "/v1/executions", &body)
                .await;
            let id = started["id"].as_str().unwrap().to_owned();
            container_started(&id).await;
            let (stdout, exit, live) = shared.events(other(i), agent, &id).await;
            (id, stdout, exit, live)
        }
    });
    for (id, stdout, exit, live) in join_all(watched).await {
        assert!(live, "the events of {id} arrived only once it had ended");
        assert_eq!(
            stdout, "tick-one\ntick-two\n",
            "live events of {id} from the other replica"
        );
        assert_eq!(exit["status"], "succeeded", "{exit}");
        ids.push(id);
    }

    // An output file written on one replica, downloaded from the other.
    let body =
        json!({"language": "bash", "code": "echo -n shared > /output/note.txt", "wait": true});
    let (status, record) = shared.post(&a, &agent, "/v1/executions", &body).await;
    assert_eq!(status, 200, "{record}");
    let id = record["id"].as_str().unwrap().to_owned();
    let download = shared
        .http
        .get(format!("{}/v1/executions/{id}/outputs/note.txt", b.url))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    assert_eq!(download.status().as_u16(), 200);
    assert_eq!(download.bytes().await.unwrap().as_ref(), b"shared");
    ids.push(id);
    assert_eq!(ids.len(), 61);

    // Afterwards: the one chain verifies, one decision event per execution, no container.
    let (status, verified) = shared.get(&b, &auditor, "/v1/audit/verify").await;
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["broken"], Value::Null, "{verified}");
    assert!(verified["events"].as_i64().unwrap() > 61, "{verified}");
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT execution_id, count(*) FROM audit_events WHERE kind = 'execution.decision' \
         AND execution_id = ANY($1) GROUP BY execution_id",
    )
    .bind(&ids)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        counts.len(),
        ids.len(),
        "every execution has its decision event"
    );
    assert!(counts.iter().all(|(_, n)| *n == 1), "{counts:?}");
    let gaps: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (ORDER BY seq) AS prev FROM audit_events) s \
         WHERE prev IS NOT NULL AND seq <> prev + 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(gaps, 0, "the chain's seq has gaps");
    no_container_left(&ids).await;

    // A reload on A reaches B: both run the new revision, and /readyz says so for each.
    let data = shared.policy_dir.join("data/tenants.yaml");
    let mut tenants = std::fs::read_to_string(&data).unwrap();
    tenants.push_str("\n# changed by the replicas test\n");
    std::fs::write(&data, tenants).unwrap();
    let (status, reloaded) = shared
        .post(&a, &admin, "/v1/policy/reload", &json!({}))
        .await;
    assert_eq!(status, 200, "{reloaded}");
    let revision = reloaded["revision"].as_str().unwrap().to_owned();
    assert_eq!(reloaded["changed"], true, "{reloaded}");
    let mut seen = Value::Null;
    for _ in 0..100 {
        seen = shared
            .http
            .get(format!("{}/readyz", b.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rows = seen["replicas"].as_array().cloned().unwrap_or_default();
        let runs = |instance: &str| {
            rows.iter().any(|row| {
                row["instance"] == instance && row["policy_revision"] == revision.as_str()
            })
        };
        if runs(&a.instance) && runs(&b.instance) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = seen["replicas"].as_array().cloned().unwrap_or_default();
    for instance in [&a.instance, &b.instance] {
        assert!(
            rows.iter().any(|row| row["instance"] == instance.as_str()
                && row["policy_revision"] == revision.as_str()
                && row["policy_error"].is_null()),
            "{instance} does not run {revision}: {seen}"
        );
    }
    let (_, policy) = shared.get(&b, &admin, "/v1/policy").await;
    assert_eq!(policy["revision"], revision.as_str(), "{policy}");

    pool.close().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_replica_is_closed_by_the_other_and_its_own_reaper_removes_its_container() {
    let shared = Shared::new().await;
    let mut a = shared.start(None).await;
    let b = shared.start(None).await;
    let agent = shared.key("agent", "acme").await;

    let body = json!({"language": "bash", "code": "echo started; sleep 60", "wait": false});
    let (_, started) = shared.post(&a, &agent, "/v1/executions", &body).await;
    let id = started["id"].as_str().unwrap().to_owned();
    container_started(&id).await;
    // A watcher on B follows the run on A, and is still reading when A dies.
    let so_far = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let watcher = {
        let (http, url, agent, id) = (
            shared.http.clone(),
            b.url.clone(),
            agent.clone(),
            id.clone(),
        );
        let so_far = std::sync::Arc::clone(&so_far);
        tokio::spawn(async move {
            let mut response = http
                .get(format!("{url}/v1/executions/{id}/events"))
                .bearer_auth(&agent)
                .send()
                .await
                .unwrap();
            let mut text = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
                so_far.lock().unwrap().clone_from(&text);
            }
            text
        })
    };
    // A dies once B has relayed the live output (not after a guess at how long that takes).
    for _ in 0..300 {
        if so_far.lock().unwrap().contains("started") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.kill();

    let record = shared.finished(&b, &agent, &id).await;
    assert_eq!(record["status"], "error", "{record}");
    let reason = format!(
        "closed by {}: owner {} lease expired",
        b.instance, a.instance
    );
    assert_eq!(record["error"], reason.as_str(), "{record}");
    let seen = tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .unwrap()
        .unwrap();
    assert!(
        seen.contains("started"),
        "live output from the other replica: {seen}"
    );
    assert!(
        seen.contains("event: exit") && seen.contains("\"error\""),
        "{seen}"
    );
    // B never touches A's container: it is still there until A comes back.
    assert!(
        !common::containers_of(&id).is_empty(),
        "another replica removed A's container"
    );

    let a = shared.start(Some(&a.data)).await;
    no_container_left(std::slice::from_ref(&id)).await;
    let (_, after) = shared
        .get(&a, &agent, &format!("/v1/executions/{id}"))
        .await;
    assert_eq!(after["status"], "error", "{after}");
    assert_eq!(
        after["error"],
        reason.as_str(),
        "the returning replica did not reopen it"
    );
    let _ = &a.listen;
    a.stop().await;
    b.stop().await;
}

/// A session held for review belongs to no replica: it outlives several lease periods without
/// being closed as `lease_expired`, and approving it on the other replica opens it there.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_session_approved_on_the_other_replica_opens_there() {
    let shared = Shared::new().await;
    let a = shared.start(None).await;
    let b = shared.start(None).await;
    let agent = shared.key("agent", "acme").await;
    let reviewer = shared.key("reviewer", "review-desk").await;
    let body = json!({"language": "python", "network": [{"host": "review.example", "port": 443}]});
    let (status, held) = shared.post(&a, &agent, "/v1/sessions", &body).await;
    assert_eq!(status, 202, "{held}");
    let id = held["id"].as_str().unwrap().to_owned();
    let approval = held["approval_id"].as_str().unwrap().to_owned();

    // Several lease periods: neither replica takes the waiting session for a dead one's.
    tokio::time::sleep(Duration::from_millis(3 * LEASE_MS.parse::<u64>().unwrap())).await;
    let (_, waiting) = shared.get(&b, &agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(waiting["status"], "pending_approval", "{waiting}");

    let path = format!("/v1/approvals/{approval}");
    let (status, decided) = shared
        .post(&b, &reviewer, &path, &json!({"decision": "approve"}))
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["session"]["status"], "ready", "{decided}");
    let run = |code: &str| json!({ "code": code });
    let path = format!("/v1/sessions/{id}/executions");
    let (status, first) = shared.post(&b, &agent, &path, &run("x = 1")).await;
    assert_eq!(status, 200, "{first}");
    let (_, second) = shared.post(&b, &agent, &path, &run("x + 1")).await;
    assert_eq!(second["result"], "2", "{second}");
    assert_eq!(second["instance"], b.instance, "{second}");

    let closed = shared
        .http
        .delete(format!("{}/v1/sessions/{id}", b.url))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status().as_u16(), 200);
    a.stop().await;
    b.stop().await;
}
