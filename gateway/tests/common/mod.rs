//! Shared harness for the gateway's integration tests: a real PostgreSQL (one private cluster
//! per test run, a fresh database per test), the real Docker daemon with runsc, and the gateway
//! served in-process on a loopback port. Missing pieces fail the test with set-up instructions.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // shared by several test binaries; panics are failure reports

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use gateway::audit::AuditStore;
use gateway::config::Config;
use gateway::database::EmbeddedPostgres;
use gateway::runtime::docker::DockerRuntime;

pub mod egress;
pub mod files_upstream;
pub mod payloads;
pub mod upstream;
pub mod warm;

pub const SETUP: &str = "run `make test` (or `bash scripts/setup.sh && make build`) as root first";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// The static sandbox-init binary the sandboxes need.
pub fn sandbox_init() -> PathBuf {
    let path = std::env::var_os("SANDGATE_SANDBOX_INIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace_root().join("target/x86_64-unknown-linux-gnu/release/sandbox-init")
        });
    assert!(
        path.is_file(),
        "sandbox-init not found at {}: build it with `make build`; {SETUP}",
        path.display()
    );
    path
}

/// Checks dockerd, the runsc runtime and the sandbox images once per test binary.
pub fn require_docker() {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let info = Command::new("docker")
            .args(["info", "--format", "{{json .Runtimes}}"])
            .output()
            .unwrap_or_else(|err| panic!("docker CLI not runnable ({err}); {SETUP}"));
        assert!(
            info.status.success(),
            "dockerd is not reachable: {}; {SETUP}",
            String::from_utf8_lossy(&info.stderr)
        );
        assert!(
            String::from_utf8_lossy(&info.stdout).contains("\"runsc\""),
            "the runsc runtime is not registered in dockerd; {SETUP}"
        );
        for image in ["sandgate/python", "sandgate/bash"] {
            let found = Command::new("docker")
                .args(["image", "inspect", "--format", "{{.Id}}", image])
                .output()
                .expect("docker image inspect");
            assert!(found.status.success(), "image {image} is missing; {SETUP}");
        }
    });
}

/// One private PostgreSQL cluster for the whole test run (under target/), started on demand.
fn cluster() -> &'static EmbeddedPostgres {
    static CLUSTER: OnceLock<EmbeddedPostgres> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir = workspace_root().join("target/test-pg");
        EmbeddedPostgres::start(&dir, None)
            .unwrap_or_else(|err| panic!("cannot start the test PostgreSQL: {err}; {SETUP}"))
    })
}

/// A new, empty database for one test; returns its URL.
pub async fn fresh_database() -> String {
    let pg = cluster();
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    gateway::database::create_database_if_missing(pg, &name)
        .await
        .expect("create test database");
    let socket_dir = pg.socket_dir();
    format!(
        "postgres://postgres@localhost/{name}?host={}&port=5432",
        socket_dir.display()
    )
}

/// A copy of the shipped policy bundle, to change without touching the repository.
pub fn copy_of_shipped() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("policies/."))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    dir
}

pub fn test_config(database_url: Option<String>, data_dir: &Path) -> Config {
    let mut config = Config {
        database_url,
        data_dir: data_dir.to_owned(),
        policy_dir: workspace_root().join("policies"),
        sandbox_init: Some(sandbox_init()),
        // Cold unless a test asks for the pool (`warm_config`): a waiting Python sandbox costs
        // seconds of CPU to preload, which every test binary would otherwise pay.
        warm_pool: Default::default(),
        ..Config::default()
    };
    config.listen = "127.0.0.1:0".parse().unwrap();
    config
}

/// A gateway served in-process on a loopback port.
pub struct TestGateway {
    pub url: String,
    pub http: reqwest::Client,
    pub shutdown: CancellationToken,
    pub server: JoinHandle<Result<(), gateway::ServeError>>,
    pub database_url: Option<String>,
    pub data_dir: tempfile::TempDir,
    /// What the warm pool had waiting at the last request, in warm mode ([`warm`]).
    pub mirror: warm::Mirror,
}

impl TestGateway {
    /// A gateway on its own fresh database.
    pub async fn start() -> TestGateway {
        let url = fresh_database().await;
        TestGateway::start_with(Some(url), |_| {}).await
    }

    pub async fn start_with(
        database_url: Option<String>,
        tweak: impl FnOnce(&mut Config),
    ) -> TestGateway {
        let data_dir = tempfile::tempdir().expect("tempdir");
        TestGateway::start_in(database_url, data_dir, tweak).await
    }

    /// A gateway on a fresh database with `dir` configured as the dataset `census`.
    pub async fn start_with_census(dir: &Path) -> TestGateway {
        let url = fresh_database().await;
        let path = dir.to_owned();
        TestGateway::start_with(Some(url), move |config| {
            config.datasets.insert(
                "census".to_owned(),
                gateway::config::Dataset {
                    path,
                    description: "census extract".to_owned(),
                },
            );
        })
        .await
    }

    /// A gateway on `data_dir` (a restart keeps the one [`TestGateway::stop_keeping_data`] gave back).
    pub async fn start_in(
        database_url: Option<String>,
        data_dir: tempfile::TempDir,
        tweak: impl FnOnce(&mut Config),
    ) -> TestGateway {
        TestGateway::start_on(DockerRuntime::new(), database_url, data_dir, tweak).await
    }

    /// A gateway driving `runtime`'s daemon (a test's private dockerd: see `dockerd_restart.rs`).
    pub async fn start_on(
        runtime: DockerRuntime,
        database_url: Option<String>,
        data_dir: tempfile::TempDir,
        tweak: impl FnOnce(&mut Config),
    ) -> TestGateway {
        require_docker();
        // The embedded cluster runs as `postgres`, which must be able to enter the data dir.
        std::fs::set_permissions(
            data_dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut config = test_config(database_url.clone(), data_dir.path());
        warm::configure(&mut config);
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(gateway::serve_on(
            listener,
            config,
            Arc::new(runtime),
            shutdown.clone(),
        ));
        let gw = TestGateway {
            url: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            shutdown,
            server,
            database_url,
            data_dir,
            mirror: warm::Mirror::default(),
        };
        gw.wait_healthy().await;
        gw
    }

    /// The `sandgate.instance` label value of this gateway's containers.
    pub async fn instance(&self) -> String {
        let ready: Value = self
            .http
            .get(format!("{}/readyz", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ready["instance"].as_str().unwrap().to_owned()
    }

    async fn wait_healthy(&self) {
        for _ in 0..600 {
            if self.server.is_finished() {
                panic!("the gateway exited during start-up (see the log above)");
            }
            if let Ok(response) = self.http.get(format!("{}/healthz", self.url)).send().await {
                if response.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the gateway did not become healthy within 30 s");
    }

    /// A pool on the gateway's database (for keys and audit assertions).
    pub async fn pool(&self) -> PgPool {
        let url = self
            .database_url
            .as_deref()
            .expect("gateway has a database URL");
        let options: PgConnectOptions = url.parse().unwrap();
        PgPool::connect_with(options).await.unwrap()
    }

    pub async fn key(&self, role: &str, tenant: &str) -> String {
        let pool = self.pool().await;
        let key = AuditStore::new(pool.clone())
            .create_key(role, tenant)
            .await
            .unwrap();
        pool.close().await;
        key.secret
    }

    /// A key of `role` for `tenant` held by `principal` (who approves, withdraws, is named in the
    /// audit): its secret.
    pub async fn key_of(&self, role: &str, tenant: &str, principal: &str) -> String {
        self.key_with_id(role, tenant, principal).await.1
    }

    /// As `key_of`, with the key's id first: (id, secret).
    pub async fn key_with_id(&self, role: &str, tenant: &str, principal: &str) -> (String, String) {
        let pool = self.pool().await;
        let key = AuditStore::new(pool.clone())
            .create_key_for(role, tenant, Some(principal))
            .await
            .unwrap();
        pool.close().await;
        (key.id, key.secret)
    }

    pub async fn post(&self, key: &str, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        note_container(&body);
        (status, body)
    }

    /// `GET /v1/sessions/{id}`, which must answer 200.
    pub async fn session(&self, key: &str, id: &str) -> Value {
        let (status, body) = self.get(key, &format!("/v1/sessions/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `GET /v1/audit/verify` as a new auditor: the chain is whole.
    pub async fn assert_chain_verifies(&self) {
        let auditor = self.key_of("auditor", "acme", "audit-team").await;
        let (status, body) = self.get(&auditor, "/v1/audit/verify").await;
        assert_eq!(status, 200, "{body}");
        assert!(body["broken"].is_null(), "{body}");
    }

    pub async fn delete(&self, key: &str, path: &str) -> (u16, Value) {
        let response = self
            .http
            .delete(format!("{}{path}", self.url))
            .bearer_auth(key)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, key: &str, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(key)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        note_container(&body);
        (status, body)
    }

    /// Runs `code` and returns (HTTP status, body).
    pub async fn execute(
        &self,
        key: &str,
        language: &str,
        code: &str,
        extra: Value,
    ) -> (u16, Value) {
        let mut body = json!({"language": language, "code": code, "wait": true});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        if self.mirror.pools(language, &body) {
            self.mirror.settle(&self.http, &self.url, language).await;
        }
        let (status, record) = self.post(key, "/v1/executions", &body).await;
        if status == 200 && self.mirror.expect_warm(language, &body, &record) {
            assert_eq!(record["start"], "warm", "expected a warm start: {record}");
        }
        (status, record)
    }

    /// Stops the gateway and hands back its data directory, for a restart.
    pub async fn stop_keeping_data(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(90), self.server)
            .await
            .expect("gateway shut down in time")
            .expect("gateway task");
        result.expect("gateway exited cleanly");
        self.data_dir
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(90), self.server)
            .await
            .expect("gateway shut down in time")
            .expect("gateway task");
        result.expect("gateway exited cleanly");
    }
}

/// Container names the harness saw in records, by execution id (a pooled sandbox carries no
/// execution label: its record names it).
static CONTAINERS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Remembers `record`'s container, if it names one.
pub fn note_container(record: &Value) {
    if let (Some(id), Some(container)) = (record["id"].as_str(), record["container"].as_str()) {
        CONTAINERS
            .lock()
            .unwrap()
            .push((id.to_owned(), container.to_owned()));
    }
}

/// Whether every container of this execution is gone within a few seconds: an execution's
/// stopped container is removed in the background once its answer has been sent.
pub fn removed_soon(execution_id: &str) -> bool {
    for _ in 0..150 {
        if containers_of(execution_id).is_empty() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// Containers (running or not) labelled with this execution id, or named in its record.
pub fn containers_of(execution_id: &str) -> Vec<String> {
    let named: Vec<String> = CONTAINERS
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _)| id == execution_id)
        .map(|(_, container)| container.clone())
        .collect();
    let mut found: Vec<String> = named
        .iter()
        .flat_map(|name| containers_named(name))
        .collect();
    found.extend(containers_labelled(execution_id));
    found
}

/// Ids of the containers (running or not) named exactly `name`.
fn containers_named(name: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args(["ps", "-a", "-q", "--filter", &format!("name=^/{name}$")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Whether a container (running or not) is named exactly `name`.
pub fn container_exists(name: &str) -> bool {
    !containers_named(name).is_empty()
}

/// Polls `check` every 50 ms until it answers `Some`, and returns that; panics naming `what`
/// once `within` has passed. For a state the system reaches on its own (an approval expired, a
/// window summarised, a writer blocked on a lock): a fixed sleep is too long on a quiet machine
/// and too short on a loaded one.
pub async fn until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sleeps until just past `at` (an RFC 3339 time from an answer, e.g. an approval's
/// `expires_at`): for a test of what happens once a deadline the gateway set has passed, with
/// nothing to poll that would not itself act on the deadline.
pub async fn sleep_past(at: &Value) {
    let at: chrono::DateTime<chrono::Utc> = at
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {at}"))
        .parse()
        .unwrap();
    let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
}

/// [`until`] for a condition with nothing to return.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until(within, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

fn containers_labelled(execution_id: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=sandgate.execution={execution_id}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Now, in the form `docker events --since` takes (unix seconds with a fraction).
pub fn docker_now() -> String {
    let now = chrono::Utc::now();
    format!("{}.{:09}", now.timestamp(), now.timestamp_subsec_nanos())
}

/// Names of the execution containers created with `label` between `since` ([`docker_now`])
/// and now: proves no container was created for an execution, even one removed again at once.
/// Sandboxes the warm pool starts (`sandgate-sb_*`, no execution yet) are not counted.
pub fn containers_created_since(since: &str, label: &str) -> Vec<String> {
    let until = chrono::Utc::now().timestamp() + 1;
    let output = Command::new("docker")
        .args([
            "events",
            "--since",
            since,
            "--until",
            &until.to_string(),
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--filter",
            &format!("label={label}"),
            "--format",
            "{{.Actor.Attributes.name}}",
        ])
        .output()
        .expect("docker events");
    assert!(output.status.success(), "docker events failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|name| !name.starts_with("sandgate-sb_"))
        .map(str::to_owned)
        .collect()
}

/// The Python environment of the toolkit tests (scripts/setup.sh makes it).
pub fn python_venv() -> PathBuf {
    let venv = std::env::var_os("SANDGATE_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/py"));
    assert!(
        venv.join("bin/python").is_file(),
        "no Python test environment at {}: run `bash scripts/setup.sh` (it makes it with pip); {SETUP}",
        venv.display()
    );
    venv
}

/// Runs `script` with the test environment's Python as an agent platform runs E2B's SDKs:
/// `E2B_API_URL` and `E2B_SANDBOX_URL` at the gateway's `/e2b`, `E2B_API_KEY` the agent's key,
/// and `extra` variables (e.g. `OTHER_KEY`, a second key). The script prints one JSON line
/// last: its answer.
pub async fn e2b_agent(
    script: &str,
    url: &str,
    agent: &str,
    extra: &[(&str, &str)],
) -> serde_json::Value {
    let python = python_venv().join("bin/python");
    let e2b = format!("{url}/e2b");
    let (script, agent) = (script.to_owned(), agent.to_owned());
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", &script])
            .env("E2B_API_URL", &e2b)
            .env("E2B_SANDBOX_URL", &e2b)
            .env("E2B_API_KEY", agent)
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG")
            .envs(extra)
            .output()
            .expect("running the test environment's python")
    })
    .await
    .expect("the agent's task");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the agent failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|err| panic!("{err}: {stdout}\n{stderr}"))
}
