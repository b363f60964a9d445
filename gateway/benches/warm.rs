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
use common::{
    bench_main, env_usize, ms, private_postgres, sandbox_init, Gateway, Series, DATABASE,
};

const SITUATION: &str = r#"
import pandas as pd
import matplotlib.pyplot as plt
frame = pd.read_csv("sales.csv").dropna()
frame["month"] = pd.to_datetime(frame["month"])
trend = frame.groupby("month")["amount"].sum()
ax = trend.plot(title="Sales")
ax.figure.savefig("/output/trend.png")
print(len(frame))
"#;

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
        return mixed::run(&pg, &url, root, &init, mixed_rounds).await;
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
    ok & mixed::run(&pg, &url, root, &init, mixed_rounds).await
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

/// The four shipped tenants, mixed (item 5 above).
mod mixed {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use base64::Engine as _;
    use serde_json::{json, Value};

    use gateway::audit::AuditStore;

    use super::common::{ms, Gateway, Series, StopOnDrop, DATABASE};

    const FORGE_SUITE: &str = r#"
import unittest
class Arithmetic(unittest.TestCase):
    pass
for n in range(40):
    setattr(Arithmetic, f"test_{n}", lambda self, n=n: self.assertEqual(sum(range(n)), n * (n - 1) // 2))
result = unittest.TextTestRunner(verbosity=0).run(unittest.defaultTestLoader.loadTestsFromTestCase(Arithmetic))
print(result.testsRun, len(result.failures))
"#;
    const EXERCISE: &str =
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(18))\n";
    const CENSUS: &str = "import csv\nrows = list(csv.DictReader(open('/data/census/people.csv')))\nprint(len(rows), sum(int(r['age']) for r in rows))\n";

    /// One tenant's request in the mix.
    struct Tenant {
        name: &'static str,
        key: String,
        body: Value,
    }

    fn tenants(keys: &BTreeMap<&'static str, String>) -> Vec<Tenant> {
        let csv = "month,amount\n2026-01-01,10\n2026-02-01,12\n2026-03-01,\n2026-04-01,15\n";
        let b64 = base64::engine::general_purpose::STANDARD.encode(csv);
        let bodies = [
            (
                "acme",
                json!({"language": "python", "code": super::SITUATION,
                "files": [{"path": "sales.csv", "content_b64": b64}]}),
            ),
            ("forge", json!({"language": "python", "code": FORGE_SUITE})),
            ("classroom", json!({"language": "python", "code": EXERCISE})),
            (
                "research",
                json!({"language": "python", "code": CENSUS,
                "mounts": ["dataset:census"]}),
            ),
        ];
        bodies
            .into_iter()
            .map(|(name, body)| Tenant {
                name,
                key: keys[name].clone(),
                body,
            })
            .collect()
    }

    async fn gateway(url: &str, dir: &Path, init: &Path, census: &Path, warm: bool) -> Gateway {
        let census = census.to_owned();
        Gateway::start(url.to_owned(), dir, init, move |config| {
            config.datasets.insert(
                "census".to_owned(),
                gateway::config::Dataset {
                    path: census,
                    description: "census extract".to_owned(),
                },
            );
            if warm {
                config.warm_pool = BTreeMap::from([("python".to_owned(), 1)]);
                config.warm_pool_memory_mb = 8192;
            }
        })
        .await
    }

    /// Runs `rounds` of the four tenants one after another; per tenant its times, and the
    /// starts that were warm.
    async fn rounds(
        gw: &Gateway,
        tenants: &[Tenant],
        rounds: usize,
    ) -> (BTreeMap<&'static str, Vec<f64>>, usize, usize, bool) {
        let (mut times, mut warm, mut total, mut ok) = (BTreeMap::new(), 0, 0, true);
        for _ in 0..rounds {
            for tenant in tenants {
                let began = Instant::now();
                let (status, record) = gw.run(&tenant.key, tenant.body.clone()).await;
                let took = ms(began.elapsed());
                if status != 200 || record["status"] != "succeeded" {
                    eprintln!("{} failed: {status} {record}", tenant.name);
                    ok = false;
                }
                times.entry(tenant.name).or_insert_with(Vec::new).push(took);
                warm += usize::from(record["start"] == "warm");
                total += 1;
            }
        }
        (times, warm, total, ok)
    }

    /// Waits (up to two minutes) until every key the pool wants has a sandbox waiting.
    async fn settled(gw: &Gateway) {
        for _ in 0..1200 {
            let ready: Value = gw
                .http
                .get(format!("{}/readyz", gw.url))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let keys = ready["checks"]["warm_pool"]["keys"].as_array().cloned();
            if keys.is_some_and(|keys| {
                keys.iter()
                    .all(|k| k["target"] == 0 || k["waiting"].as_u64() > Some(0))
            }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("the pool did not settle within two minutes");
    }

    pub async fn run(pg: &StopOnDrop, url: &str, root: &Path, init: &Path, n: usize) -> bool {
        let census = root.join("census");
        std::fs::create_dir_all(&census).unwrap();
        let people: String = (0..1000)
            .map(|i| format!("p{i},{}\n", 20 + i % 60))
            .collect();
        std::fs::write(census.join("people.csv"), format!("name,age\n{people}")).unwrap();
        let warm_gw = gateway(url, &root.join("mixed-warm"), init, &census, true).await;
        let store = AuditStore::new(
            gateway::database::pool(pg.0.connect_options(DATABASE))
                .await
                .unwrap(),
        );
        let mut keys = BTreeMap::new();
        for tenant in ["acme", "forge", "classroom", "research"] {
            keys.insert(
                tenant,
                store.create_key("agent", tenant).await.unwrap().secret,
            );
        }
        let tenants = tenants(&keys);
        // Warm-up: one round makes every key wanted; then the pool fills.
        let (_, _, _, mut ok) = rounds(&warm_gw, &tenants, 1).await;
        settled(&warm_gw).await;
        let (warm_times, hits, total, fine) = rounds(&warm_gw, &tenants, n).await;
        ok &= fine;
        let memory = waiting_memory(&warm_gw).await;
        warm_gw.stop().await;
        let cold_gw = gateway(url, &root.join("mixed-cold"), init, &census, false).await;
        let (cold_times, _, _, fine) = rounds(&cold_gw, &tenants, n).await;
        ok &= fine;
        cold_gw.stop().await;
        report(n, (hits, total), memory, &warm_times, &cold_times);
        ok
    }

    async fn waiting_memory(gw: &Gateway) -> u64 {
        let ready: Value = gw
            .http
            .get(format!("{}/readyz", gw.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ready["checks"]["warm_pool"]["waiting_memory_bytes"]
            .as_u64()
            .unwrap_or(0)
    }

    fn report(
        rounds: usize,
        (hits, total): (usize, usize),
        memory: u64,
        warm: &BTreeMap<&'static str, Vec<f64>>,
        cold: &BTreeMap<&'static str, Vec<f64>>,
    ) {
        println!("mixed four-tenant workload (DESIGN 16), {rounds} rounds after one warm-up round, one request after another");
        println!(
            "  hit rate {hits}/{total} = {:.0}% (goal >= 90%); waiting sandboxes held {} MiB at the end",
            100.0 * hits as f64 / total.max(1) as f64,
            memory / (1024 * 1024)
        );
        for (tenant, times) in warm {
            let w = Series::new(times.clone());
            let c = Series::new(cold.get(tenant).cloned().unwrap_or_default());
            println!(
                "  {tenant:<10} warm p50 {:>7.0} ms p99 {:>7.0} ms | cold p50 {:>7.0} ms p99 {:>7.0} ms | p50 {:.2}x",
                w.percentile(50),
                w.percentile(99),
                c.percentile(50),
                c.percentile(99),
                w.percentile(50) / c.percentile(50)
            );
        }
    }
}
