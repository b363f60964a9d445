//! Snapshots (DESIGN 15, issue 24 item 9), measured against cold sessions in the same run:
//!
//! 1. cold: open a Python session (no warm pool: a sandbox booted for it), import pandas and
//!    build a 100k-row DataFrame, to its first result;
//! 2. pause of that session (the checkpoint written, the container gone), and the bytes of its
//!    image on disk;
//! 3. resume to the first result (an execution on the paused session restores it first), and of
//!    that the gateway's restore (sha256 check, new container, image handed to dockerd, started
//!    restored: `restore_ms` of `session.resumed`); goal <= 0.3x cold;
//! 4. a fork (`POST /v1/sessions {"from_snapshot"}` of a kept snapshot) to its first result.
//!
//! dockerd's checkpoint API needs experimental mode, which the machine's daemon does not have:
//! the bench starts a private experimental dockerd of its own (its own data root, socket and
//! bridge; the machine's daemon is not touched) and copies `sandgate/python` into it, which
//! takes about a minute before anything is measured. Measured, not asserted, except that a
//! failed step makes the run exit non-zero.
//!
//! `make bench`, or `cargo bench -p gateway --bench snapshots` as root after `make build`.
//! `SANDGATE_BENCH_RUNS` sets the runs of each series (default 3);
//! `SANDGATE_BENCH_PHASES=1` logs each restore's phases (create, copy, start) at info.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::{json, Value};

use gateway::audit::AuditStore;
use gateway::runtime::docker::DockerRuntime;

mod common;
use common::{
    bench_main, env_usize, ms, private_postgres, sandbox_init, Gateway, Series, DATABASE,
};

#[path = "../tests/dockerd_restart/daemon.rs"]
#[allow(
    dead_code,
    reason = "the bench uses the daemon's start and image copy only"
)]
mod daemon;

const BUILD: &str =
    "import pandas as pd\ndf = pd.DataFrame({'a': range(100000)})\nint(df['a'].sum())";
const USE: &str = "int(df['a'].sum())";
const SUM: &str = "4999950000";

fn main() -> ExitCode {
    let level = if std::env::var_os("SANDGATE_BENCH_PHASES").is_some() {
        tracing::Level::INFO
    } else {
        tracing::Level::WARN
    };
    bench_main("sgsnap", level, |root| async move { run(&root).await })
}

/// What one series measured, in milliseconds (and bytes).
#[derive(Default)]
struct Measured {
    cold: Vec<f64>,
    pause: Vec<f64>,
    resume: Vec<f64>,
    restore: Vec<f64>,
    check: Vec<f64>,
    fork: Vec<f64>,
    bytes: Vec<f64>,
}

async fn run(root: &Path) -> bool {
    let daemon = tokio::task::spawn_blocking(|| {
        let daemon = daemon::PrivateDockerd::start_experimental();
        daemon.load_image("sandgate/python");
        daemon
    })
    .await
    .unwrap();
    let (pg, url) = private_postgres(root).await;
    let runs = env_usize("SANDGATE_BENCH_RUNS", 3);
    let runtime = DockerRuntime::at(&daemon.socket());
    let gw = Gateway::start_on(runtime, url, &root.join("gw"), &sandbox_init(), |config| {
        config.snapshots.enabled = true;
        config.max_sessions = 8;
        // Cold means cold: no waiting sandbox of any shape (the pool sizes itself by demand
        // within this memory, and `warm_pool` floors are none here).
        config.warm_pool_memory_mb = 0;
    })
    .await;
    let pool = gateway::database::pool(pg.0.connect_options(DATABASE))
        .await
        .unwrap();
    let store = AuditStore::new(pool.clone());
    let key = store.create_key("agent", "acme").await.unwrap().secret;
    let mut measured = Measured::default();
    let mut ok = true;
    for _ in 0..runs {
        ok &= cold_pause_resume(&gw, &pool, &key, &mut measured).await;
    }
    ok &= forks(&gw, &key, runs, &mut measured).await;
    gw.stop().await;
    report(runs, &measured);
    ok
}

/// A cold session built, paused, resumed by its next execution; then closed.
async fn cold_pause_resume(
    gw: &Gateway,
    pool: &sqlx::PgPool,
    key: &str,
    measured: &mut Measured,
) -> bool {
    let began = Instant::now();
    let Some(id) = open(gw, key, json!({"language": "python"})).await else {
        return false;
    };
    let built = turn(gw, key, &id, BUILD).await;
    measured.cold.push(ms(began.elapsed()));
    let began = Instant::now();
    let (status, paused) = post(gw, key, &format!("/v1/sessions/{id}/pause"), json!({})).await;
    measured.pause.push(ms(began.elapsed()));
    let began = Instant::now();
    let first = turn(gw, key, &id, USE).await;
    measured.resume.push(ms(began.elapsed()));
    let resumed: Option<Value> = sqlx::query_scalar(
        "SELECT decision FROM audit_events WHERE kind = 'session.resumed' \
         AND input->>'session_id' = $1",
    )
    .bind(&id)
    .fetch_optional(pool)
    .await
    .unwrap();
    if let Some(resumed) = resumed {
        measured
            .restore
            .push(resumed["restore_ms"].as_f64().unwrap_or(0.0));
        measured
            .check
            .push(resumed["check_ms"].as_f64().unwrap_or(0.0));
        measured
            .bytes
            .push(resumed["bytes"].as_f64().unwrap_or(0.0));
    }
    close(gw, key, &id).await;
    let fine = built == Some(SUM.into()) && status == 200 && first == Some(SUM.into());
    if !fine {
        eprintln!("cold/pause/resume failed: pause {status} {paused}");
    }
    fine
}

/// `runs` forks of one kept snapshot, each to its first result.
async fn forks(gw: &Gateway, key: &str, runs: usize, measured: &mut Measured) -> bool {
    let Some(parent) = open(gw, key, json!({"language": "python"})).await else {
        return false;
    };
    let mut ok = turn(gw, key, &parent, BUILD).await == Some(SUM.into());
    let (status, snapshot) = post(
        gw,
        key,
        &format!("/v1/sessions/{parent}/snapshots"),
        json!({}),
    )
    .await;
    ok &= status == 201;
    for _ in 0..runs {
        let began = Instant::now();
        let body = json!({"language": "python", "from_snapshot": snapshot["id"]});
        let Some(fork) = open(gw, key, body).await else {
            return false;
        };
        ok &= turn(gw, key, &fork, USE).await == Some(SUM.into());
        measured.fork.push(ms(began.elapsed()));
        close(gw, key, &fork).await;
    }
    close(gw, key, &parent).await;
    ok
}

fn report(runs: usize, m: &Measured) {
    let p50 = |v: &[f64]| Series::new(v.to_vec()).percentile(50);
    let cold = p50(&m.cold);
    println!("snapshots benchmark ({runs} runs each; p50)");
    println!("  cold: open + import pandas + 100k-row DataFrame   {cold:.0} ms");
    println!(
        "  pause                                             {:.0} ms",
        p50(&m.pause)
    );
    println!(
        "  resume to first result                            {:.0} ms ({:.2}x cold; goal <= 0.3x)",
        p50(&m.resume),
        p50(&m.resume) / cold
    );
    println!(
        "    of which the gateway's restore (restore_ms)     {:.0} ms",
        p50(&m.restore)
    );
    println!(
        "      of which the sha256 check (check_ms)          {:.0} ms",
        p50(&m.check)
    );
    println!(
        "  fork to first result                              {:.0} ms ({:.2}x cold)",
        p50(&m.fork),
        p50(&m.fork) / cold
    );
    println!(
        "  bytes on disk per snapshot                        {:.0}",
        p50(&m.bytes)
    );
}

async fn post(gw: &Gateway, key: &str, path: &str, body: Value) -> (u16, Value) {
    let response = gw
        .http
        .post(format!("{}{path}", gw.url))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn open(gw: &Gateway, key: &str, body: Value) -> Option<String> {
    let (status, opened) = post(gw, key, "/v1/sessions", body).await;
    if status != 201 {
        eprintln!("open failed: {status} {opened}");
        return None;
    }
    opened["id"].as_str().map(str::to_owned)
}

async fn close(gw: &Gateway, key: &str, id: &str) {
    let _ = gw
        .http
        .delete(format!("{}/v1/sessions/{id}", gw.url))
        .bearer_auth(key)
        .send()
        .await;
}

/// The result of a session turn, if it succeeded.
async fn turn(gw: &Gateway, key: &str, id: &str, code: &str) -> Option<String> {
    let (status, record) = post(
        gw,
        key,
        &format!("/v1/sessions/{id}/executions"),
        json!({"code": code}),
    )
    .await;
    if status != 200 || record["status"] != "succeeded" {
        eprintln!("turn failed: {status} {record}");
        return None;
    }
    record["result"].as_str().map(str::to_owned)
}
