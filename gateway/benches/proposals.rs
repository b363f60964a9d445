//! The time to create a policy proposal (issue 25): build the candidate bundle, run its YAML
//! cases and golden matrix, and replay the recorded decisions, over 10,000 recorded execution
//! decisions (`SANDGATE_BENCH_DECISIONS` changes the count), through an in-process gateway on
//! a private PostgreSQL. The decisions are the shipped policy's own, for inputs varied over
//! tenant, language, network and mounts, appended through `AuditStore::record_event` as
//! `execution.decision` events. Prints the median and slowest of 5 creations, and the
//! replay's share (the same replay timed alone). Run by `make bench`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is a failure report

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use gateway::audit::{AuditStore, NewEvent};
use gateway::config::Config;
use gateway::database::EmbeddedPostgres;
use gateway::runtime::docker::DockerRuntime;

mod common;
use common::{env_usize, workspace_root};

const CREATIONS: usize = 5;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::ERROR)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let root = tempfile::Builder::new()
        .prefix("sgbench")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        root.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let pg = EmbeddedPostgres::start(&root.path().join("db"), None)
        .unwrap_or_else(|err| panic!("cannot start the bench PostgreSQL: {err}"));
    let passed = runtime.block_on(run(&pg, root.path()));
    if let Err(err) = pg.stop() {
        eprintln!("stopping the bench PostgreSQL failed: {err}");
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run(pg: &EmbeddedPostgres, root: &Path) -> bool {
    let decisions = env_usize("SANDGATE_BENCH_DECISIONS", 10_000);
    gateway::database::create_database_if_missing(pg, "proposals")
        .await
        .unwrap();
    let socket_dir = pg.pgdata().parent().unwrap().join("run");
    let url = format!(
        "postgres://postgres@localhost/proposals?host={}&port=5432",
        socket_dir.display()
    );
    let policy = root.join("policies");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("policies"))
        .arg(&policy)
        .status()
        .unwrap();
    assert!(copied.success());
    let (base, shutdown, server) =
        start_gateway(config(url.clone(), &root.join("gw"), &policy)).await;
    let pool = sqlx::PgPool::connect_with(pg.connect_options("proposals"))
        .await
        .unwrap();
    let store = AuditStore::new(pool.clone());
    record_decisions(&store, &policy, decisions).await;
    let reviewer = store.create_key("reviewer", "ops").await.unwrap().secret;

    let http = reqwest::Client::new();
    let body = json!({"title": "bench", "patch":
        {"data/tenants.yaml": {"tenants": {"forge": {"languages": ["python", "bash", "ruby"]}}}}});
    let mut times = Vec::new();
    for _ in 0..CREATIONS {
        let started = Instant::now();
        let answer = http
            .post(format!("{base}/v1/policy/proposals"))
            .bearer_auth(&reviewer)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let created: Value = answer.json().await.unwrap_or(Value::Null);
        times.push(started.elapsed());
        if status != 201 || created["evidence"]["replay"]["total"] != json!(decisions) {
            println!("FAIL: proposal not created over {decisions} decisions: {status} {created}");
            return false;
        }
    }
    shutdown.cancel();
    server.await.unwrap().unwrap();
    let replay = time_replay(&store, &policy).await;
    pool.close().await;
    times.sort();
    println!("proposal creation (candidate, cases + matrix, replay) over {decisions} recorded decisions:");
    println!(
        "  median {:.0} ms, slowest {:.0} ms ({CREATIONS} creations)",
        ms(times[CREATIONS / 2]),
        ms(times[CREATIONS - 1])
    );
    let median = times[CREATIONS / 2];
    println!(
        "  the replay alone (read the window, re-decide on base and candidate): median {:.0} ms, \
         {:.0}% of the median creation",
        ms(replay),
        100.0 * replay.as_secs_f64() / median.as_secs_f64().max(f64::EPSILON)
    );
    true
}

/// The replay a creation runs, timed alone ([`CREATIONS`] times, the median): the window read
/// from the store and every input re-decided on the base and the candidate (here the shipped
/// bundle for both: the same decisions).
async fn time_replay(store: &AuditStore, policy: &Path) -> Duration {
    let engine = Arc::new(policy_engine::PolicyEngine::load(policy).unwrap());
    let mut times = Vec::new();
    for _ in 0..CREATIONS {
        let started = Instant::now();
        let since = chrono::Utc::now() - chrono::Duration::days(7);
        let recent = store
            .execution_decisions_recent(since, gateway::app::proposals::MAX_REPLAY_DECISIONS)
            .await
            .unwrap();
        let engine = Arc::clone(&engine);
        tokio::task::spawn_blocking(move || {
            gateway::app::replay::replay_between(&engine, &engine, &recent.decisions)
        })
        .await
        .unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    times[CREATIONS / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// `count` execution decisions of the shipped policy, inputs varied, as recorded events.
async fn record_decisions(store: &AuditStore, policy: &Path, count: usize) {
    let engine = policy_engine::PolicyEngine::load(policy).unwrap();
    let tenants = ["acme", "forge", "classroom", "research", "nosuch"];
    let languages = ["python", "bash", "ruby"];
    let networks = [
        json!([]),
        json!([{"host": "pypi.org", "port": 443}]),
        json!([{"host": "evil.example", "port": 443}]),
    ];
    let mounts = [json!([]), json!(["dataset:census"])];
    let mut writes = Vec::new();
    for n in 0..count {
        let input = json!({
            "principal": {"key_id": "key_bench", "tenant": tenants[n % 5], "role": "agent"},
            "request": {"language": languages[n / 5 % 3], "code_sha256": "0", "code_bytes": 1,
                "files": [], "network": networks[n / 15 % 3], "mounts": mounts[n / 45 % 2],
                "limits": {}, "labels": {}},
            "environment": {"backends": ["gvisor"], "datasets": ["census"], "now": "2026-01-01T00:00:00Z"},
        });
        let decision = json!(engine.decide_json(&input));
        let event = NewEvent {
            kind: api_types::EventKind::ExecutionDecision,
            execution_id: Some(format!("ex_bench{n:06}")),
            key_id: Some("key_bench".to_owned()),
            tenant: Some(tenants[n % 5].to_owned()),
            decision_id: None,
            allow: decision["allow"].as_bool(),
            reasons: decision["reasons"].clone(),
            input,
            decision,
            policy_revision: Some(engine.revision().to_owned()),
        };
        writes.push(event);
    }
    for chunk in writes.chunks(64) {
        let batch = chunk.iter().map(|event| store.record_event(event));
        for result in futures_util::future::join_all(batch).await {
            result.unwrap();
        }
    }
}

fn config(database_url: String, data_dir: &Path, policy: &Path) -> Config {
    let mut config = Config {
        database_url: Some(database_url),
        data_dir: data_dir.to_owned(),
        policy_dir: policy.to_owned(),
        sandbox_init: Some(PathBuf::from("/nonexistent/sandbox-init")),
        warm_pool: Default::default(),
        ..Config::default()
    };
    config.pending_approvals.per_key = 100;
    config.pending_approvals.per_tenant = 100;
    config.listen = "127.0.0.1:0".parse().unwrap();
    config
}

async fn start_gateway(
    config: Config,
) -> (
    String,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), gateway::ServeError>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(gateway::serve_on(
        listener,
        config,
        Arc::new(DockerRuntime::new()),
        shutdown.clone(),
    ));
    let http = reqwest::Client::new();
    for _ in 0..600 {
        assert!(!server.is_finished(), "the gateway exited during start-up");
        let health = http.get(format!("{url}/healthz")).send().await;
        if health.is_ok_and(|r| r.status().is_success()) {
            return (url, shutdown, server);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway did not become healthy");
}
