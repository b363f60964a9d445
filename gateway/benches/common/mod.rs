//! What the gateway benches share: a private PostgreSQL, an in-process gateway, percentiles.
#![allow(dead_code, reason = "each bench uses its own part")]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use gateway::config::Config;
use gateway::database::EmbeddedPostgres;
use gateway::runtime::docker::DockerRuntime;

pub const CODE: &str = "print(1)";
pub const DATABASE: &str = "sandgate";
/// What a missing prerequisite's message says to do.
pub const SETUP: &str = "run `make bench` as root after `bash scripts/setup.sh && make build`";

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The static sandbox-init: `SANDGATE_SANDBOX_INIT`, else under the cargo target directory.
pub fn sandbox_init() -> PathBuf {
    let path = std::env::var_os("SANDGATE_SANDBOX_INIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"));
            target.join("x86_64-unknown-linux-gnu/release/sandbox-init")
        });
    assert!(
        path.is_file(),
        "sandbox-init not found at {}: `make build` (or set SANDGATE_SANDBOX_INIT)",
        path.display()
    );
    path
}

/// Stops the private cluster however the run ends (before its directory is removed).
pub struct StopOnDrop(pub EmbeddedPostgres);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Err(err) = self.0.stop() {
            eprintln!("stopping the bench PostgreSQL failed: {err}");
        }
    }
}

/// What every bench's `main` does: tracing to stderr at `level`, a two-worker runtime, a
/// scratch directory (`prefix`...) for `run`, and the exit code of its verdict (false: FAIL).
pub fn bench_main<F>(
    prefix: &str,
    level: tracing::Level,
    run: impl FnOnce(PathBuf) -> F,
) -> ExitCode
where
    F: Future<Output = bool>,
{
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let root = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    if runtime.block_on(run(root.path().to_owned())) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A private cluster under `root` (mode 0755: the cluster runs as `postgres`), stopped on drop.
pub fn private_cluster(root: &Path) -> StopOnDrop {
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    StopOnDrop(
        EmbeddedPostgres::start(&root.join("db"), None)
            .unwrap_or_else(|err| panic!("cannot start the bench PostgreSQL: {err}")),
    )
}

/// The URL of `database` on the private cluster `pg` (its Unix socket).
pub fn url_of(pg: &EmbeddedPostgres, database: &str) -> String {
    let socket_dir = pg.pgdata().parent().unwrap().join("run");
    format!(
        "postgres://postgres@localhost/{database}?host={}&port=5432",
        socket_dir.display()
    )
}

/// A private cluster under `root`, stopped on drop, with the bench database, and its URL.
pub async fn private_postgres(root: &Path) -> (StopOnDrop, String) {
    let pg = private_cluster(root);
    gateway::database::create_database_if_missing(&pg.0, DATABASE)
        .await
        .unwrap();
    let url = url_of(&pg.0, DATABASE);
    (pg, url)
}

/// The configuration of a bench that runs no sandbox (the audit store, the refusals): any
/// attempt to start one fails at once.
pub fn config_without_sandboxes(database_url: &str, data_dir: &Path) -> Config {
    let mut config = Config {
        database_url: Some(database_url.to_owned()),
        data_dir: data_dir.to_owned(),
        policy_dir: workspace_root().join("policies"),
        sandbox_init: Some(PathBuf::from("/nonexistent/sandbox-init")),
        ..Config::default()
    };
    config.listen = "127.0.0.1:0".parse().unwrap();
    config
}

/// A gateway served in-process on a loopback port.
pub struct Gateway {
    pub url: String,
    pub http: reqwest::Client,
    pub config: Config,
    pub shutdown: CancellationToken,
    pub server: tokio::task::JoinHandle<Result<(), gateway::ServeError>>,
}

impl Gateway {
    /// A gateway on `database_url`, without a warm pool unless `tweak` configures one.
    pub async fn start(
        database_url: String,
        data_dir: &Path,
        init: &Path,
        tweak: impl FnOnce(&mut Config),
    ) -> Gateway {
        Gateway::start_on(DockerRuntime::new(), database_url, data_dir, init, tweak).await
    }

    /// The same on `runtime` (a private dockerd's).
    pub async fn start_on(
        runtime: DockerRuntime,
        database_url: String,
        data_dir: &Path,
        init: &Path,
        tweak: impl FnOnce(&mut Config),
    ) -> Gateway {
        let mut config = Config {
            database_url: Some(database_url),
            data_dir: data_dir.to_owned(),
            policy_dir: workspace_root().join("policies"),
            sandbox_init: Some(init.to_owned()),
            warm_pool: Default::default(),
            ..Config::default()
        };
        config.listen = "127.0.0.1:0".parse().unwrap();
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(gateway::serve_on(
            listener,
            config.clone(),
            Arc::new(runtime),
            shutdown.clone(),
        ));
        let gw = Gateway {
            url: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            config,
            shutdown,
            server,
        };
        for _ in 0..600 {
            assert!(
                !gw.server.is_finished(),
                "the gateway exited during start-up"
            );
            let health = gw.http.get(format!("{}/healthz", gw.url)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return gw;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the gateway did not become healthy within 30 s");
    }

    /// `print(1)` with `wait: true`: (HTTP status, body).
    pub async fn execute(&self, key: &str) -> (u16, Value) {
        self.run(
            key,
            json!({"language": "python", "code": CODE, "wait": true}),
        )
        .await
    }

    /// Any execution request, waited for: (HTTP status, body).
    pub async fn run(&self, key: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/v1/executions", self.url))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .expect("POST /v1/executions");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let served = tokio::time::timeout(Duration::from_secs(90), self.server)
            .await
            .expect("gateway shut down in time")
            .expect("gateway task");
        served.expect("gateway exited cleanly");
    }
}

/// Milliseconds, sorted.
pub struct Series(pub Vec<f64>);

impl Series {
    pub fn new(mut samples: Vec<f64>) -> Series {
        samples.sort_by(f64::total_cmp);
        Series(samples)
    }

    pub fn percentile(&self, p: usize) -> f64 {
        self.0[(self.0.len() * p / 100).min(self.0.len() - 1)]
    }

    pub fn line(&self) -> String {
        format!(
            "p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms",
            self.percentile(50),
            self.percentile(90),
            self.percentile(99)
        )
    }
}

pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
