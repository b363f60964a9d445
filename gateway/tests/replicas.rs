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

    async fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        tokio::task::spawn_blocking(move || self.child.wait())
            .await
            .unwrap()
            .unwrap();
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
