//! The warm pool's refill and creation paths (issue 26 items 3, 6 and 7), measured against
//! baselines in the same run. Measured, not asserted, except that a failed execution or
//! session makes the run exit non-zero.
//!
//! 1. Refill rate, boot against restore: a gateway brings `SANDGATE_BENCH_REFILL` (default 4)
//!    Python sandboxes with the default preload (numpy, pandas, matplotlib) to ready from
//!    nothing, on a private dockerd in experimental mode; once with snapshots off (every sandbox
//!    booted: runsc boot + imports), once on (the first start boots the key's template and
//!    checkpoints it, every later one restores it). Reported: time to the first waiting
//!    sandbox, and the steady rate over the rest (sandboxes/s; goal >= 1).
//! 2. Session creation (`POST /v1/sessions`, python) warm against cold on the machine's dockerd
//!    (`SANDGATE_BENCH_RUNS`, default 10 each; goal warm/cold p50 <= 0.3x).
//! 3. The mixed workload of the four shipped tenants (`mixed/mod.rs`) on the experimental
//!    dockerd, the pool refilling by restore; `warm.rs` runs the same mix on the machine's
//!    dockerd, where the pool boots.
//!
//! `make bench`, or `cargo bench -p gateway --bench pool_refill` as root after `make build`.
//! `SANDGATE_BENCH_ONLY=refill` runs part 1 alone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use gateway::audit::AuditStore;
use gateway::runtime::docker::DockerRuntime;

mod common;
mod mixed;
use common::{
    bench_main, env_usize, ms, private_postgres, sandbox_init, Gateway, Series, DATABASE,
};

#[allow(
    dead_code,
    reason = "the e2e tests' helper; this bench uses part of it"
)]
#[path = "../tests/dockerd_restart/daemon.rs"]
mod daemon;

fn main() -> ExitCode {
    bench_main("sgrefill", tracing::Level::INFO, |root| async move {
        run(&root).await
    })
}

async fn run(root: &Path) -> bool {
    let (pg, url) = private_postgres(root).await;
    let init = sandbox_init();
    let count = u32::try_from(env_usize("SANDGATE_BENCH_REFILL", 4).max(2)).unwrap();
    let runs = env_usize("SANDGATE_BENCH_RUNS", 10);
    let daemon = tokio::task::spawn_blocking(|| {
        let daemon = daemon::PrivateDockerd::start_experimental();
        daemon.load_image("sandgate/python");
        daemon
    })
    .await
    .unwrap();
    let socket = daemon.socket();
    let refill = |restore: bool, dir: &'static str| {
        let (url, init, socket) = (url.clone(), init.clone(), socket.clone());
        let dir = root.join(dir);
        async move { refill_times(&url, &dir, &init, (&socket, restore), count).await }
    };
    let boot = refill(false, "refill-boot").await;
    let restore = refill(true, "refill-restore").await;
    println!("warm pool refill (issue 26 item 6), {count} python sandboxes with the default preload, private experimental dockerd");
    for (name, (first, rest)) in [("boot   ", boot), ("restore", restore)] {
        println!(
            "  {name}: first waiting after {:.1} s; then {:.2} sandboxes/s (goal >= 1)",
            first.as_secs_f64(),
            f64::from(count - 1) / rest.as_secs_f64()
        );
    }
    if std::env::var("SANDGATE_BENCH_ONLY").as_deref() == Ok("refill") {
        return true;
    }
    let mut ok = sessions(&pg, &url, root, &init, runs).await;
    let rounds = runs.div_ceil(2).max(2);
    ok &= mixed::run(
        &pg,
        &url,
        root,
        &init,
        rounds,
        &mixed::Daemon::Experimental(socket),
    )
    .await;
    drop(daemon);
    ok
}

/// From a fresh gateway's start: the time to its first waiting Python sandbox, and from there
/// to `count` waiting.
async fn refill_times(
    url: &str,
    dir: &Path,
    init: &Path,
    (socket, restore): (&Path, bool),
    count: u32,
) -> (Duration, Duration) {
    let began = Instant::now();
    let gw = Gateway::start_on(
        DockerRuntime::at(socket),
        url.to_owned(),
        dir,
        init,
        |config| {
            config.warm_pool = BTreeMap::from([("python".to_owned(), count as usize)]);
            config.snapshots.enabled = restore;
        },
    )
    .await;
    let mut first = None;
    for _ in 0..30_000 {
        let waiting = waiting_python(&gw).await;
        if waiting >= 1 && first.is_none() {
            first = Some(began.elapsed());
        }
        if waiting >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = first.unwrap_or_else(|| began.elapsed());
    let rest = began.elapsed() - first;
    let keys = ready(&gw).await["checks"]["warm_pool"]["keys"].clone();
    eprintln!(
        "refill {}: {keys}",
        if restore { "restore" } else { "boot" }
    );
    gw.stop().await;
    (first, rest)
}

async fn ready(gw: &Gateway) -> Value {
    gw.http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or(Value::Null)
}

async fn waiting_python(gw: &Gateway) -> u32 {
    ready(gw).await["checks"]["warm_pool"]["keys"]
        .as_array()
        .map_or(0, |keys| {
            keys.iter()
                .filter(|k| k["language"] == "python" && k["serves"] == "execution")
                .filter_map(|k| k["waiting"].as_u64())
                .map(|n| u32::try_from(n).unwrap_or(0))
                .sum()
        })
}

async fn session_waiting(gw: &Gateway) -> bool {
    ready(gw).await["checks"]["warm_pool"]["keys"]
        .as_array()
        .is_some_and(|keys| {
            keys.iter()
                .any(|k| k["serves"] == "session" && k["waiting"].as_u64() > Some(0))
        })
}

/// `POST /v1/sessions` (python) then `DELETE`; the creation's time and its `start`.
async fn create_session(gw: &Gateway, key: &str) -> Option<(f64, String)> {
    let began = Instant::now();
    let response = gw
        .http
        .post(format!("{}/v1/sessions", gw.url))
        .bearer_auth(key)
        .json(&json!({"language": "python"}))
        .send()
        .await
        .ok()?;
    let took = ms(began.elapsed());
    let status = response.status().as_u16();
    let session: Value = response.json().await.unwrap_or(Value::Null);
    if status != 201 && status != 200 {
        eprintln!("session creation failed: {status} {session}");
        return None;
    }
    let id = session["id"].as_str()?.to_owned();
    gw.http
        .delete(format!("{}/v1/sessions/{id}", gw.url))
        .bearer_auth(key)
        .send()
        .await
        .ok()?;
    Some((
        took,
        session["start"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// Session creation warm (each waits for a waiting session sandbox first) against cold, on
/// the machine's dockerd.
async fn sessions(
    pg: &common::StopOnDrop,
    url: &str,
    root: &Path,
    init: &Path,
    runs: usize,
) -> bool {
    let cold = Gateway::start(url.to_owned(), &root.join("sessions-cold"), init, |_| {}).await;
    let store = AuditStore::new(
        gateway::database::pool(pg.0.connect_options(DATABASE))
            .await
            .unwrap(),
    );
    let key = store.create_key("agent", "acme").await.unwrap().secret;
    let warm = Gateway::start(
        url.to_owned(),
        &root.join("sessions-warm"),
        init,
        |config| {
            config.warm_pool = BTreeMap::from([("python".to_owned(), 1)]);
        },
    )
    .await;
    let (mut warm_ms, mut cold_ms, mut ok) = (vec![], vec![], true);
    // The first claim of the session key is a miss that makes it wanted.
    ok &= create_session(&warm, &key).await.is_some();
    for _ in 0..runs {
        for _ in 0..1200 {
            if session_waiting(&warm).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match create_session(&warm, &key).await {
            Some((took, start)) if start == "warm" => warm_ms.push(took),
            other => {
                eprintln!("a warm session creation was not warm: {other:?}");
                ok = false;
            }
        }
        match create_session(&cold, &key).await {
            Some((took, _)) => cold_ms.push(took),
            None => ok = false,
        }
    }
    warm.stop().await;
    cold.stop().await;
    let (w, c) = (Series::new(warm_ms), Series::new(cold_ms));
    println!("session creation (issue 26 item 3), python, {runs} runs per series");
    println!("  warm POST /v1/sessions   {}", w.line());
    println!("  cold POST /v1/sessions   {}", c.line());
    println!(
        "  warm / cold               p50 {:.2}x (goal <= 0.3x)",
        w.percentile(50) / c.percentile(50)
    );
    ok
}
