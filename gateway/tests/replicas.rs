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
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

/// Short leases, so a dead replica is noticed in seconds (renewed every 500 ms).
const LEASE_MS: &str = "1500";

/// One `sandgate serve` process and what reaches it.
struct Replica {
    child: Child,
    url: String,
    data: PathBuf,
    listen: String,
    instance: String,
}

struct Shared {
    database_url: String,
    policy_dir: PathBuf,
    http: reqwest::Client,
}

fn free_listen() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

impl Shared {
    async fn new() -> Shared {
        common::require_docker();
        let policy = common::copy_of_shipped().keep();
        Shared {
            database_url: common::fresh_database().await,
            policy_dir: policy,
            http: reqwest::Client::new(),
        }
    }

    /// Starts a replica with its own data directory (or `data` again, after a kill).
    async fn start(&self, data: Option<&Path>) -> Replica {
        self.start_with(data, &[]).await
    }

    /// [`Shared::start`] with more `SANDGATE_*` settings.
    async fn start_with(&self, data: Option<&Path>, env: &[(&str, &str)]) -> Replica {
        let data = data.map(Path::to_owned).unwrap_or_else(|| {
            let dir = tempfile::tempdir().unwrap().keep();
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            dir
        });
        let listen = free_listen();
        let log = std::fs::File::create(data.join("serve.log")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .env("SANDGATE_DATABASE_URL", &self.database_url)
            .env("SANDGATE_DATA_DIR", &data)
            .env("SANDGATE_LISTEN", &listen)
            .env("SANDGATE_POLICY_DIR", &self.policy_dir)
            .env("SANDGATE_SANDBOX_INIT", common::sandbox_init())
            .env("SANDGATE_WARM_POOL", "{}")
            .env("SANDGATE_LEASE_MS", LEASE_MS)
            .env("SANDGATE_APPROVAL_TTL_S", "600")
            .envs(env.iter().copied())
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let url = format!("http://{listen}");
        let mut instance = String::new();
        for _ in 0..400 {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(data.join("serve.log")).unwrap_or_default();
                panic!("sandgate serve exited ({status}):\n{log}");
            }
            if let Ok(response) = self.http.get(format!("{url}/readyz")).send().await {
                let body: Value = response.json().await.unwrap_or_default();
                if let Some(id) = body["instance"].as_str() {
                    instance = id.to_owned();
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!instance.is_empty(), "sandgate serve did not come up");
        Replica {
            child,
            url,
            data,
            listen,
            instance,
        }
    }

    async fn key(&self, role: &str, tenant: &str) -> String {
        let pool = sqlx::PgPool::connect(&self.database_url).await.unwrap();
        let key = gateway::audit::AuditStore::new(pool.clone())
            .create_key(role, tenant)
            .await
            .unwrap()
            .secret;
        pool.close().await;
        key
    }

    async fn post(&self, at: &Replica, key: &str, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", at.url))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, at: &Replica, key: &str, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", at.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Polls `GET /v1/executions/{id}` on `at` until it has finished.
    async fn finished(&self, at: &Replica, key: &str, id: &str) -> Value {
        for _ in 0..1200 {
            let (_, record) = self.get(at, key, &format!("/v1/executions/{id}")).await;
            if record["finished_at"].is_string() {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{id} never finished");
    }

    /// The events of `id` read from `at`, until the stream ends: (stdout text, exit data,
    /// whether the record was still unfinished when the first output arrived: the stream was
    /// live, not a replay of the stored record).
    async fn events(&self, at: &Replica, key: &str, id: &str) -> (String, Value, bool) {
        let mut response = self
            .http
            .get(format!("{}/v1/executions/{id}/events", at.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "events of {id}");
        let (mut text, mut live) = (String::new(), None);
        while let Some(chunk) = response.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if live.is_none() && text.contains("event: stdout") {
                let (_, record) = self.get(at, key, &format!("/v1/executions/{id}")).await;
                live = Some(record["finished_at"].is_null());
            }
        }
        let (mut stdout, mut exit) = (String::new(), Value::Null);
        for block in text.split("\n\n") {
            let name = block.lines().find_map(|l| l.strip_prefix("event: "));
            let data = block.lines().find_map(|l| l.strip_prefix("data: "));
            let (Some(name), Some(data)) = (name, data) else {
                continue;
            };
            let data: Value = serde_json::from_str(data).unwrap();
            match name {
                "stdout" => stdout.push_str(data["text"].as_str().unwrap()),
                "exit" => exit = data,
                _ => {}
            }
        }
        (stdout, exit, live == Some(true))
    }
}

impl Replica {
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    async fn stop(self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        tokio::task::spawn_blocking(move || {
            let mut replica = self;
            replica.child.wait()
        })
        .await
        .unwrap()
        .unwrap();
    }
}

/// A test that panics must not leave a `sandgate serve` running: a replica still running when
/// it is dropped is killed (and reaped).
impl Drop for Replica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until `id`'s sandbox exists.
async fn container_started(id: &str) {
    for _ in 0..400 {
        if !common::containers_of(id).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the sandbox of {id} never started");
}

/// Waits until no container of `ids` is left.
async fn no_container_left(ids: &[String]) {
    let mut left = Vec::new();
    for _ in 0..100 {
        left = ids
            .iter()
            .filter(|id| !common::containers_of(id).is_empty())
            .cloned()
            .collect();
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("containers left behind for {left:?}");
}

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

impl Shared {
    async fn delete(&self, at: &Replica, key: &str, path: &str) -> (u16, Value) {
        let response = self
            .http
            .delete(format!("{}{path}", at.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

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
    let mut left = true;
    for _ in 0..100 {
        let out = Command::new("docker")
            .args([
                "ps",
                "-a",
                "-q",
                "--filter",
                &format!("name=^/{container}$"),
            ])
            .output()
            .unwrap();
        left = !String::from_utf8_lossy(&out.stdout).trim().is_empty();
        if !left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!left, "the session's container {container} is still there");

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
async fn a_purge_on_one_replica_removes_the_files_the_other_collected() {
    let shared = Shared::new().await;
    // A never purges by itself: what goes from its disk, B's purge removed.
    let a = shared
        .start_with(None, &[("SANDGATE_RETENTION_DAYS", "0")])
        .await;
    let agent = shared.key("agent", "acme").await;
    let body = json!({"language": "bash", "code": "echo -n old > /output/old.txt", "wait": true});
    let (status, record) = shared.post(&a, &agent, "/v1/executions", &body).await;
    assert_eq!(status, 200, "{record}");
    let id = record["id"].as_str().unwrap().to_owned();
    let collected = a.data.join("outputs").join(&id);
    assert!(collected.join("old.txt").is_file(), "collected on A's disk");

    // Past B's retention: B purges it at its first sweep (at start).
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    sqlx::query("UPDATE executions SET finished_at = now() - interval '40 days' WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    let b = shared
        .start_with(None, &[("SANDGATE_RETENTION_DAYS", "30")])
        .await;
    let mut gone = false;
    for _ in 0..200 {
        if !collected.exists() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let purged_by: Option<String> = sqlx::query_scalar(
        "SELECT input->>'executions' FROM audit_events WHERE kind = 'retention.purge'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert!(purged_by.unwrap_or_default().contains(&id), "B purged it");
    assert!(gone, "A's collected files of {id} are still on its disk");
    let (status, refused) = shared
        .get(&a, &agent, &format!("/v1/executions/{id}/outputs/old.txt"))
        .await;
    assert_eq!(status, 404, "{refused}");
    pool.close().await;
    a.stop().await;
    b.stop().await;
}

/// SSE blocks as (id, event name, data).
fn sse_blocks(text: &str) -> Vec<(u64, String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(name).map(str::to_owned))
            };
            let id = field("id: ")?.parse().ok()?;
            let data = serde_json::from_str(&field("data: ")?).ok()?;
            Some((id, field("event: ")?, data))
        })
        .collect()
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

/// `/readyz` of `at` until every replica in `instances` runs `revision` (its last answer).
async fn readyz_until(shared: &Shared, at: &Replica, instances: &[&str], revision: &str) -> Value {
    let mut seen = Value::Null;
    for _ in 0..100 {
        seen = shared
            .http
            .get(format!("{}/readyz", at.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rows = seen["replicas"].as_array().cloned().unwrap_or_default();
        let runs = |instance: &&str| {
            rows.iter().any(|row| {
                row["instance"] == *instance
                    && row["policy_revision"] == revision
                    && row["policy_error"].is_null()
            })
        };
        if instances.iter().all(runs) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
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
    let mut left = true;
    for _ in 0..200 {
        let out = Command::new("docker")
            .args([
                "ps",
                "-a",
                "-q",
                "--filter",
                &format!("name=^/{container}$"),
            ])
            .output()
            .unwrap();
        left = !String::from_utf8_lossy(&out.stdout).trim().is_empty();
        if !left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !left,
        "the dead replica's session container {container} is still there"
    );
    let (_, after) = shared.get(&a, &agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(after["closed_reason"], "lease_expired", "{after}");
    pool.close().await;
    a.stop().await;
    b.stop().await;
}
