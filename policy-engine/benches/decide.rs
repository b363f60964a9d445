//! Decision latency (DESIGN.md section 8): p50 and p99 of `decide()` in µs for the shipped policy
//! against a trivial one, measured in the same run, plus `decide_egress()` and a two-thread run
//! that shows decisions do not serialise on a lock. Measured, not asserted.
//!
//! `make bench`, or `cargo bench -p policy-engine --bench decide`. `SANDGATE_BENCH_ITERATIONS`
//! changes the number of timed decisions per series (default 20000).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use policy_engine::{
    Connection, EgressExecution, EgressInput, Environment, HostPort, HostRule, NetworkGrant,
    PolicyEngine, PolicyInput, Principal, RequestInput,
};

const WARM_UP: usize = 2_000;
/// Timed decisions are taken in blocks alternating between the series compared, so that load
/// from elsewhere on the machine falls on both alike.
const BLOCK: usize = 500;

fn main() {
    let iterations: usize = std::env::var("SANDGATE_BENCH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let shipped =
        PolicyEngine::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")).unwrap();
    let trivial_dir = tempfile::TempDir::new().unwrap();
    std::fs::write(
        trivial_dir.path().join("trivial.rego"),
        "package sandgate.execution\n\
         decision := {\"allow\": true, \"backend\": \"gvisor\", \"limits\": {\"timeout_ms\": 30000, \
         \"memory_mb\": 512, \"cpus\": 1.0, \"pids\": 256, \"disk_mb\": 256, \"output_bytes\": 1048576}}\n",
    )
    .unwrap();
    let trivial = PolicyEngine::load(trivial_dir.path()).unwrap();

    let plain = execution_input(false);
    let full = execution_input(true);
    let mut denied = execution_input(true);
    denied.principal.tenant = "forge".into();
    let egress = egress_input();
    assert!(shipped.decide(&plain).allow && shipped.decide(&plain).network.is_none());
    let full_decision = shipped.decide(&full);
    assert!(
        full_decision.allow && full_decision.network.is_some() && !full_decision.mounts.is_empty()
    );
    assert!(!shipped.decide(&denied).allow);
    assert!(trivial.decide(&plain).allow);
    assert!(shipped.decide_egress(&egress).allow);

    println!("decision latency, {iterations} timed decisions per series after {WARM_UP} warm-up");
    let series = measure_interleaved(
        iterations,
        &mut [
            &mut || drop(black_box(trivial.decide(black_box(&plain)))),
            &mut || drop(black_box(shipped.decide(black_box(&plain)))),
            &mut || drop(black_box(shipped.decide(black_box(&full)))),
            &mut || drop(black_box(shipped.decide(black_box(&denied)))),
            &mut || drop(black_box(shipped.decide_egress(black_box(&egress)))),
        ],
    );
    let [trivial_s, plain_s, full_s, denied_s, egress_s] = series.as_slice() else {
        unreachable!("five series measured")
    };
    report("trivial policy, decide()", trivial_s, None);
    report("shipped, decide() acme python", plain_s, Some(trivial_s));
    report(
        "shipped, decide() + pypi.org:443 + census",
        full_s,
        Some(trivial_s),
    );
    report(
        "shipped, decide() forge asks the same: deny",
        denied_s,
        Some(trivial_s),
    );
    report("shipped, decide_egress() pypi.org:443", egress_s, None);

    // Two threads deciding at once on one engine: with no global lock, each thread's latency stays
    // close to the single-thread figure and throughput roughly doubles (given two idle cores).
    let single = throughput(&shipped, &plain, 1, iterations);
    let double = throughput(&shipped, &plain, 2, iterations);
    println!(
        "shipped, decide() on 1 thread:  {:>8.0} decisions/s",
        single.per_second
    );
    println!(
        "shipped, decide() on 2 threads: {:>8.0} decisions/s ({:.2}x), per-thread p50 {:.1} µs, p99 {:.1} µs",
        double.per_second,
        double.per_second / single.per_second,
        double.p50,
        double.p99
    );
}

fn execution_input(network_and_mount: bool) -> PolicyInput {
    let mut request = RequestInput {
        language: "python".into(),
        code_sha256: "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9".into(),
        code_bytes: 8,
        ..RequestInput::default()
    };
    request.limits.timeout_ms = Some(5000);
    if network_and_mount {
        request.network = vec![HostPort {
            host: "pypi.org".into(),
            port: 443,
        }];
        request.mounts = vec!["dataset:census".into()];
    }
    PolicyInput {
        principal: Principal {
            key_id: "key_bench".into(),
            tenant: "acme".into(),
            role: "agent".into(),
        },
        request,
        environment: Environment {
            backends: vec!["gvisor".into(), "runc".into()],
            datasets: vec!["census".into()],
            now: "2025-01-01T00:00:00Z".into(),
        },
    }
}

fn egress_input() -> EgressInput {
    EgressInput {
        execution: EgressExecution {
            id: "ex_bench".into(),
            tenant: "acme".into(),
            grant: NetworkGrant {
                allow: vec![
                    HostRule::new("files.pythonhosted.org", vec![443]),
                    HostRule::new("pypi.org", vec![443]),
                ],
                max_connections: 32,
                max_bytes: 104_857_600,
                max_denied: None,
                max_denied_per_s: None,
            },
        },
        connection: Connection {
            host: "pypi.org".into(),
            port: 443,
            scheme: "https".into(),
            method: None,
            path: None,
            query: None,
            headers: None,
            upgrade: None,
        },
    }
}

/// Per-call latencies in µs, sorted.
struct Series(Vec<f64>);

impl Series {
    fn percentile(&self, p: usize) -> f64 {
        self.0[(self.0.len() * p / 100).min(self.0.len() - 1)]
    }
}

fn measure_interleaved(iterations: usize, calls: &mut [&mut dyn FnMut()]) -> Vec<Series> {
    for call in calls.iter_mut() {
        for _ in 0..WARM_UP {
            call();
        }
    }
    let mut samples: Vec<Vec<f64>> = calls
        .iter()
        .map(|_| Vec::with_capacity(iterations))
        .collect();
    while samples[0].len() < iterations {
        let block = BLOCK.min(iterations - samples[0].len());
        for (call, samples) in calls.iter_mut().zip(samples.iter_mut()) {
            for _ in 0..block {
                let started = Instant::now();
                call();
                samples.push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    samples
        .into_iter()
        .map(|mut samples| {
            samples.sort_by(f64::total_cmp);
            Series(samples)
        })
        .collect()
}

fn report(name: &str, series: &Series, baseline: Option<&Series>) {
    let (p50, p99) = (series.percentile(50), series.percentile(99));
    print!("{name:<46} p50 {p50:>6.1} µs  p99 {p99:>6.1} µs");
    if let Some(baseline) = baseline {
        print!(
            "  ({:.2}x / {:.2}x trivial)",
            p50 / baseline.percentile(50),
            p99 / baseline.percentile(99)
        );
    }
    println!();
}

struct Throughput {
    per_second: f64,
    p50: f64,
    p99: f64,
}

fn throughput(
    engine: &PolicyEngine,
    input: &PolicyInput,
    threads: usize,
    iterations: usize,
) -> Throughput {
    let started = Instant::now();
    let mut latencies: Vec<f64> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    (0..iterations)
                        .map(|_| {
                            let started = Instant::now();
                            black_box(engine.decide(black_box(input)));
                            started.elapsed().as_secs_f64() * 1e6
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap())
            .collect()
    });
    let elapsed: Duration = started.elapsed();
    latencies.sort_by(f64::total_cmp);
    let series = Series(latencies);
    Throughput {
        per_second: (threads * iterations) as f64 / elapsed.as_secs_f64(),
        p50: series.percentile(50),
        p99: series.percentile(99),
    }
}
