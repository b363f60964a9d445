//! The mixed workload of the four shipped tenants (DESIGN 16), one request after another
//! (acme's pandas analysis, forge's test suite, a classroom exercise at 256 MB, research reading
//! the census dataset mount), after one warm-up round: the hit rate, and p50/p99 per tenant on a
//! gateway with the demand-driven pool against one without (`warm_pool_memory_mb` 8192 there).
//! Shared by `warm.rs` (the machine's dockerd: the pool boots) and `pool_refill.rs` (a private
//! experimental dockerd: the pool refills by restore).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use gateway::audit::AuditStore;
use gateway::runtime::docker::DockerRuntime;

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
            json!({"language": "python", "code": SITUATION,
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

/// Which dockerd the gateways drive.
#[allow(dead_code, reason = "each bench drives one of them")]
pub enum Daemon {
    /// The machine's (not experimental): the pool boots every sandbox.
    Shared,
    /// A private experimental one at this socket, snapshots on: the pool refills by restore.
    Experimental(std::path::PathBuf),
}

async fn gateway(
    url: &str,
    dir: &Path,
    (init, census): (&Path, &Path),
    warm: bool,
    daemon: &Daemon,
) -> Gateway {
    let census = census.to_owned();
    let (runtime, restore) = match daemon {
        Daemon::Shared => (DockerRuntime::new(), false),
        Daemon::Experimental(socket) => (DockerRuntime::at(socket), true),
    };
    Gateway::start_on(runtime, url.to_owned(), dir, init, move |config| {
        config.snapshots.enabled = restore;
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

pub async fn run(
    pg: &StopOnDrop,
    url: &str,
    root: &Path,
    init: &Path,
    n: usize,
    daemon: &Daemon,
) -> bool {
    let census = root.join("census");
    std::fs::create_dir_all(&census).unwrap();
    let people: String = (0..1000)
        .map(|i| format!("p{i},{}\n", 20 + i % 60))
        .collect();
    std::fs::write(census.join("people.csv"), format!("name,age\n{people}")).unwrap();
    let warm_gw = gateway(url, &root.join("mixed-warm"), (init, &census), true, daemon).await;
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
    let cold_gw = gateway(
        url,
        &root.join("mixed-cold"),
        (init, &census),
        false,
        daemon,
    )
    .await;
    let (cold_times, _, _, fine) = rounds(&cold_gw, &tenants, n).await;
    ok &= fine;
    cold_gw.stop().await;
    let refill = match daemon {
        Daemon::Shared => "refill by boot",
        Daemon::Experimental(_) => "refill by restore",
    };
    report((n, refill), (hits, total), memory, &warm_times, &cold_times);
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
    (rounds, refill): (usize, &str),
    (hits, total): (usize, usize),
    memory: u64,
    warm: &BTreeMap<&'static str, Vec<f64>>,
    cold: &BTreeMap<&'static str, Vec<f64>>,
) {
    println!("mixed four-tenant workload (DESIGN 16, {refill}), {rounds} rounds after one warm-up round, one request after another");
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

pub const SITUATION: &str = r#"
import pandas as pd
import matplotlib.pyplot as plt
frame = pd.read_csv("sales.csv").dropna()
frame["month"] = pd.to_datetime(frame["month"])
trend = frame.groupby("month")["amount"].sum()
ax = trend.plot(title="Sales")
ax.figure.savefig("/output/trend.png")
print(len(frame))
"#;
