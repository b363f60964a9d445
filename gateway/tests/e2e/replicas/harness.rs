//! What the replicas tests share: a `sandgate serve` process per replica on one PostgreSQL
//! database (killed when dropped), requests to it, and waits on containers, streams and
//! `/readyz`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::common;

/// Short leases, so a dead replica is noticed in seconds (renewed every 500 ms).
pub const LEASE_MS: &str = "1500";

/// One `sandgate serve` process and what reaches it.
pub struct Replica {
    pub child: Child,
    pub url: String,
    pub data: PathBuf,
    pub listen: String,
    pub instance: String,
}

pub struct Shared {
    pub database_url: String,
    pub policy_dir: PathBuf,
    pub http: reqwest::Client,
}

pub fn free_listen() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

impl Shared {
    pub async fn new() -> Shared {
        common::require_docker();
        let policy = common::copy_of_shipped().keep();
        Shared {
            database_url: common::fresh_database().await,
            policy_dir: policy,
            http: reqwest::Client::new(),
        }
    }

    /// Starts a replica with its own data directory (or `data` again, after a kill).
    pub async fn start(&self, data: Option<&Path>) -> Replica {
        self.start_with(data, &[]).await
    }

    /// [`Shared::start`] with more `SANDGATE_*` settings.
    pub async fn start_with(&self, data: Option<&Path>, env: &[(&str, &str)]) -> Replica {
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

    pub async fn key(&self, role: &str, tenant: &str) -> String {
        let pool = sqlx::PgPool::connect(&self.database_url).await.unwrap();
        let key = gateway::audit::AuditStore::new(pool.clone())
            .create_key(role, tenant)
            .await
            .unwrap()
            .secret;
        pool.close().await;
        key
    }

    pub async fn post(&self, at: &Replica, key: &str, path: &str, body: &Value) -> (u16, Value) {
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

    pub async fn get(&self, at: &Replica, key: &str, path: &str) -> (u16, Value) {
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
    pub async fn finished(&self, at: &Replica, key: &str, id: &str) -> Value {
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
    pub async fn events(&self, at: &Replica, key: &str, id: &str) -> (String, Value, bool) {
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
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub async fn stop(self) {
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
pub async fn container_started(id: &str) {
    for _ in 0..400 {
        if !common::containers_of(id).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the sandbox of {id} never started");
}

/// Whether the container named `name` is gone (waits up to 20 s for it to go).
pub async fn container_gone(name: &str) -> bool {
    for _ in 0..200 {
        if !common::container_exists(name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Waits until no container of `ids` is left.
pub async fn no_container_left(ids: &[String]) {
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

impl Shared {
    pub async fn delete(&self, at: &Replica, key: &str, path: &str) -> (u16, Value) {
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

/// SSE blocks as (id, event name, data).
pub fn sse_blocks(text: &str) -> Vec<(u64, String, Value)> {
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

/// `/readyz` of `at` until every replica in `instances` runs `revision` (its last answer).
pub async fn readyz_until(
    shared: &Shared,
    at: &Replica,
    instances: &[&str],
    revision: &str,
) -> Value {
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
