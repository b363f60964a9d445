//! Warm start (DESIGN.md sections 8 and 10), measured against baselines in the same run.
//! Measured, not asserted, except that failed executions (or a warm run that was not warm)
//! make the run exit non-zero.
//!
//! 1. `print(1)` through a gateway whose pool keeps two Python sandboxes waiting (each run
//!    waits until one is ready, then `POST /v1/executions`, `wait: true`) against
//!    - `python3 -c pass` started inside an already-running sandbox (timed by the sandbox
//!      itself, 20 starts): target p50 <= 1.5x;
//!    - the same `print(1)` through a gateway without a pool (cold): target p50 <= 0.3x.
//! 2. The CSV -> pandas -> matplotlib PNG situation, warm (the pool preloads numpy, pandas and
//!    matplotlib) against cold: target p50 <= 0.25x.
//! 3. Pool refill: how many sandboxes per second a gateway brings to ready from nothing (python
//!    with the preload, and bash), on this machine's cores.
//! 4. Memory: the gateway process's RSS before and with the pool up, and what one waiting
//!    Python sandbox holds (its cgroup's memory usage).
//!
//! 5. A mixed workload of the four shipped tenants, one request after another (acme's pandas
//!    analysis, forge's test suite, a classroom exercise at 256 MB, research reading the census
//!    dataset mount), after one warm-up round: the hit rate, and p50/p99 per tenant on a gateway
//!    with the demand-driven pool against one without (`warm_pool_memory_mb` 8192 there).
//!
//! `make bench`, or `cargo bench -p gateway --bench warm` as root after `make build`.
//! `SANDGATE_BENCH_RUNS` sets the `print(1)` runs per series (default 20; the pandas series
//! runs a quarter as many) and the mixed workload's rounds (a quarter as many, at least 2).
//! `SANDGATE_BENCH_ONLY=mixed` runs the mixed workload alone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use gateway::audit::AuditStore;

mod common;
mod mixed;
use common::{
    bench_main, env_usize, ms, private_postgres, sandbox_init, Gateway, Series, DATABASE,
};

use mixed::SITUATION;

const PYTHON_START: &str = r#"
import json, subprocess, time
times = []
for _ in range(20):
    started = time.perf_counter()
    subprocess.run(["python3", "-c", "pass"], check=True)
    times.append((time.perf_counter() - started) * 1000)
print(json.dumps(times))
"#;

fn main() -> ExitCode {
    bench_main("sgwarm", tracing::Level::WARN, |root| async move {
        run(&root).await
    })
}

async fn run(root: &Path) -> bool {
    let (pg, url) = private_postgres(root).await;
    let init = sandbox_init();
    let runs = env_usize("SANDGATE_BENCH_RUNS", 20);
    let mixed_rounds = runs.div_ceil(4).max(2);
    if std::env::var("SANDGATE_BENCH_ONLY").as_deref() == Ok("mixed") {
        return mixed::run(&pg, &url, root, &init, mixed_rounds, &mixed::Daemon::Shared).await;
    }

    let rss_before = rss_kib();
    let cold = Gateway::start(url.clone(), &root.join("cold"), &init, |_| {}).await;
    // After the first gateway's start: it ran the migrations (the pool's role among them).
    let store = AuditStore::new(
        gateway::database::pool(pg.0.connect_options(DATABASE))
            .await
            .unwrap(),
    );
    let key = store.create_key("agent", "acme").await.unwrap().secret;
    let warm = Gateway::start(url.clone(), &root.join("warm"), &init, |config| {
        config.warm_pool = BTreeMap::from([("python".to_owned(), 2)]);
    })
    .await;
    waiting(&warm, 2).await;
    let rss_pooled = rss_kib();

    let inside = python_start_inside(&cold, &key).await;
    let mut ok = inside.is_some();
    let (mut warm_ms, mut cold_ms) = (vec![], vec![]);
    let print = json!({"language": "python", "code": "print(1)"});
    for _ in 0..runs {
        ok &= timed(&warm, &key, &print, "warm", &mut warm_ms).await;
        ok &= timed(&cold, &key, &print, "cold", &mut cold_ms).await;
    }
    let csv = "month,amount\n2026-01-01,10\n2026-02-01,12\n2026-03-01,\n2026-04-01,15\n";
    let situation = json!({"language": "python", "code": SITUATION, "files": [
        {"path": "sales.csv", "content_b64": base64::engine::general_purpose::STANDARD.encode(csv)}
    ]});
    let (mut warm_plot, mut cold_plot) = (vec![], vec![]);
    for _ in 0..runs.div_ceil(4) {
        ok &= timed(&warm, &key, &situation, "warm", &mut warm_plot).await;
        ok &= timed(&cold, &key, &situation, "cold", &mut cold_plot).await;
    }
    let held = pooled_memory_mib();
    warm.stop().await;
    cold.stop().await;

    let python_refill = refill_rate(&url, &root.join("refill-python"), &init, "python", 3).await;
    let bash_refill = refill_rate(&url, &root.join("refill-bash"), &init, "bash", 3).await;

    let (warm_s, cold_s) = (Series::new(warm_ms), Series::new(cold_ms));
    println!("warm start (DESIGN 8, 10), {runs} runs per series");
    if let Some(inside) = inside {
        let inside = Series::new(inside);
        println!(
            "  python3 -c pass inside a running sandbox   {}",
            inside.line()
        );
        println!(
            "  warm print(1) / python3 -c pass             p50 {:.2}x (goal <= 1.5x)",
            warm_s.percentile(50) / inside.percentile(50)
        );
    }
    println!(
        "  warm print(1) through the API              {}",
        warm_s.line()
    );
    println!(
        "  cold print(1) through the API              {}",
        cold_s.line()
    );
    println!(
        "  warm / cold print(1)                        p50 {:.2}x (goal <= 0.3x)",
        warm_s.percentile(50) / cold_s.percentile(50)
    );
    let (warm_p, cold_p) = (Series::new(warm_plot), Series::new(cold_plot));
    println!(
        "  warm CSV -> pandas -> PNG                  {}",
        warm_p.line()
    );
    println!(
        "  cold CSV -> pandas -> PNG                  {}",
        cold_p.line()
    );
    println!(
        "  warm / cold CSV -> pandas -> PNG            p50 {:.2}x (goal <= 0.25x)",
        warm_p.percentile(50) / cold_p.percentile(50)
    );
    println!("  refill, python with preload: {python_refill:.2} sandboxes/s; bash: {bash_refill:.2} sandboxes/s");
    println!(
        "  gateway RSS: {} MiB before, {} MiB with 2 python sandboxes waiting; one waiting python sandbox holds {}",
        rss_before / 1024,
        rss_pooled / 1024,
        held.map_or("unknown (no pooled container found)".to_owned(), |mib| format!("{mib} MiB"))
    );
    ok & mixed::run(&pg, &url, root, &init, mixed_rounds, &mixed::Daemon::Shared).await
}

/// Runs `body` (after waiting for a pooled sandbox on a warm gateway) and records its time.
async fn timed(gw: &Gateway, key: &str, body: &Value, start: &str, into: &mut Vec<f64>) -> bool {
    if start == "warm" {
        waiting(gw, 1).await;
    }
    let began = Instant::now();
    let (status, record) = gw.run(key, body.clone()).await;
    into.push(ms(began.elapsed()));
    let fine = status == 200 && record["status"] == "succeeded" && record["start"] == start;
    if !fine {
        eprintln!("{start} run failed: {status} {record}");
    }
    fine
}

/// Waits until the gateway's pool has at least `count` python sandboxes waiting.
async fn waiting(gw: &Gateway, count: u32) {
    for _ in 0..1200 {
        if python_waiting(gw).await >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the pool never had {count} python sandboxes waiting");
}

async fn python_waiting(gw: &Gateway) -> u32 {
    waiting_for(gw, "python").await
}

async fn waiting_for(gw: &Gateway, language: &str) -> u32 {
    let ready: Value = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let wanted = format!("{language}=");
    ready["checks"]["warm_pool"]["detail"]
        .as_str()
        .unwrap_or("")
        .split_whitespace()
        .find_map(|part| part.strip_prefix(&wanted)?.parse().ok())
        .unwrap_or(0)
}

/// `python3 -c pass` start-up, timed inside a running sandbox (20 starts).
async fn python_start_inside(gw: &Gateway, key: &str) -> Option<Vec<f64>> {
    let body = json!({"language": "python", "code": PYTHON_START});
    let (status, record) = gw.run(key, body).await;
    let times = serde_json::from_str(record["stdout"].as_str()?.trim()).ok();
    if status != 200 || times.is_none() {
        eprintln!("timing python3 -c pass inside a sandbox failed: {status} {record}");
    }
    times
}

/// Sandboxes per second a fresh gateway brings to ready (`count` of `language`).
async fn refill_rate(url: &str, dir: &Path, init: &Path, language: &str, count: u32) -> f64 {
    let began = Instant::now();
    let gw = Gateway::start(url.to_owned(), dir, init, |config| {
        config.warm_pool = BTreeMap::from([(language.to_owned(), count as usize)]);
    })
    .await;
    for _ in 0..3000 {
        if waiting_for(&gw, language).await >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = f64::from(count) / began.elapsed().as_secs_f64();
    gw.stop().await;
    rate
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Memory of one waiting python sandbox: its cgroup's usage (cgroup v1, cgroupfs driver).
fn pooled_memory_mib() -> Option<u64> {
    let output = Command::new("docker")
        .args([
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            "label=sandgate.pool=python",
        ])
        .output()
        .ok()?;
    let id = String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()?
        .to_owned();
    let usage = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"
    ))
    .ok()?;
    Some(usage.trim().parse::<u64>().ok()? / (1024 * 1024))
}
