//! Cold executions and audit writes (DESIGN.md section 8), measured against baselines in the
//! same run. Measured, not asserted, except that lost audit rows or failed executions make the
//! run exit non-zero.
//!
//! 1. Cold execution: `print(1)` in python through the whole gateway (an in-process gateway on
//!    a loopback port and a private PostgreSQL: `POST /v1/executions` with `wait: true`) against
//!    the same sandbox spec run straight through `DockerRuntime` (create, attach, start, job on
//!    stdin, wait, inspect, remove; runsc, network none, the same limits). Runs alternate
//!    (baseline, gateway, baseline, ...) so that load from elsewhere falls on both alike; there
//!    is no warm-up. Target: p50 ratio <= 1.10.
//! 2. 16 concurrent executions: no errors, exactly one `execution.decision` event each, and the
//!    hash chain verifies.
//!
//! Audit write capacity (group commit against binary `COPY`) is `benches/audit.rs`.
//!
//! `make bench`, or `cargo bench -p gateway --bench cold` as root (dockerd with runsc, the
//! sandbox images and the static sandbox-init: `make build`). `SANDGATE_BENCH_RUNS` changes the
//! runs per series (default 20), `SANDGATE_BENCH_CONCURRENT` the concurrent executions
//! (default 16).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use gateway::audit::AuditStore;
use gateway::config::Config;
use gateway::database::EmbeddedPostgres;
use gateway::runtime::docker::DockerRuntime;
use gateway::runtime::{
    Ending, Job, JobFile, Owner, RunControl, SandboxPlan, SandboxRuntime, Waits,
};
use policy_engine::{Environment, Limits, PolicyEngine, PolicyInput, Principal, RequestInput};

mod common;
use common::{
    bench_main, env_usize, ms, private_postgres, sandbox_init, Gateway, Series, CODE, DATABASE,
};

fn main() -> ExitCode {
    bench_main("sgbench", tracing::Level::WARN, |root| async move {
        let (pg, url) = private_postgres(&root).await;
        run(&pg.0, &url, &root.join("gateway")).await
    })
}

async fn run(pg: &EmbeddedPostgres, url: &str, data_dir: &Path) -> bool {
    let init = sandbox_init();
    let gw = Gateway::start(url.to_owned(), data_dir, &init, |_| {}).await;
    let pool = gateway::database::pool(pg.connect_options(DATABASE))
        .await
        .unwrap();
    let store = AuditStore::new(pool.clone());
    let key = store.create_key("agent", "acme").await.unwrap().secret;

    let runs = env_usize("SANDGATE_BENCH_RUNS", 20);
    let limits = decided_limits(&gw.config);
    let cold_ok = cold(&gw, &key, &init, &limits, runs).await;
    let concurrent_ok = concurrent(&gw, &key, &store, &pool).await;
    gw.stop().await;
    pool.close().await;
    cold_ok && concurrent_ok
}

/// The limits the gateway will grant `acme` for this program: the shipped policy's decision,
/// lowered to the configured ceilings (`app::floor::clamp`). Checked against every
/// gateway response afterwards.
fn decided_limits(config: &Config) -> Limits {
    let engine = PolicyEngine::load(&config.policy_dir).unwrap();
    let input = PolicyInput {
        principal: Principal {
            key_id: "key_bench".into(),
            tenant: "acme".into(),
            role: "agent".into(),
        },
        request: RequestInput {
            language: "python".into(),
            code_sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(CODE)),
            code_bytes: CODE.len() as u64,
            ..RequestInput::default()
        },
        environment: Environment {
            backends: config.backends.keys().cloned().collect(),
            datasets: vec![],
            now: Utc::now().to_rfc3339(),
        },
    };
    let decision = engine.decide(&input);
    assert!(
        decision.allow,
        "the shipped policy denies acme: {decision:?}"
    );
    let mut limits = decision.limits.unwrap();
    gateway::app::floor::clamp(&mut limits, &config.ceilings);
    limits
}

/// The sandbox and job the gateway builds for `print(1)` (the same plan, command and
/// environment as the launch path), with plain directories for its socket and output.
fn baseline_spec(
    init: &Path,
    limits: &Limits,
    dirs: &Path,
) -> (SandboxPlan, Job<'static>, RunControl) {
    let (argv, program) = gateway::app::launch::command_for("python");
    let id = gateway::ids::new("bench");
    let (egress_dir, output_dir) = (
        dirs.join(format!("{id}-egress")),
        dirs.join(format!("{id}-output")),
    );
    for dir in [&egress_dir, &output_dir] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let plan = SandboxPlan {
        id: id.clone(),
        owner: Owner::Execution(id),
        instance: "gw_bench_baseline".to_owned(),
        image: "sandgate/python".to_owned(),
        runtime: "runsc".to_owned(),
        init_binary: init.to_owned(),
        limits: limits.clone(),
        mounts: vec![],
        egress_dir,
        output_dir,
        env: gateway::app::launch::sandbox_env(limits.cpus),
        waits: Waits::Init,
    };
    let job = Job {
        argv,
        cwd: Some("/workspace".to_owned()),
        env: Some(gateway::app::launch::sandbox_env(limits.cpus)),
        files: vec![JobFile {
            path: program.to_owned(),
            content_b64: base64::engine::general_purpose::STANDARD
                .encode(CODE)
                .into(),
            mode: Some(0o755),
        }],
        proxy: None,
        exit_nonce: None,
    };
    let control = RunControl {
        timeout: Duration::from_millis(limits.timeout_ms),
        output_cap: usize::try_from(limits.output_bytes).unwrap_or(usize::MAX),
        sink: None,
        cancel: CancellationToken::new(),
    };
    (plan, job, control)
}

fn ms_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e3
}

/// Where one gateway run's time went, from its record's timestamps.
struct Phases {
    /// Request sent -> marked running: HTTP, auth, decision, audit commit, slot.
    before: f64,
    /// Marked running -> completed: output area, sandbox, collection, completion write.
    sandbox: f64,
    /// Completed -> response read: stream close, serialisation, HTTP.
    after: f64,
}

fn phases(sent: DateTime<Utc>, received: DateTime<Utc>, body: &Value) -> Option<Phases> {
    let at = |field: &str| {
        body[field]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    let (started, finished) = (at("started_at")?, at("finished_at")?);
    Some(Phases {
        before: ms_between(sent, started),
        sandbox: ms_between(started, finished),
        after: ms_between(finished, received),
    })
}

/// Target 1: alternating baseline and gateway runs. False if any run failed.
async fn cold(gw: &Gateway, key: &str, init: &Path, limits: &Limits, runs: usize) -> bool {
    let docker = DockerRuntime::new();
    let dirs = tempfile::tempdir().unwrap();
    let health = docker.health(&["runsc".to_owned()]).await;
    assert!(
        health.docker.is_ok() && health.runtimes.values().all(|ok| *ok),
        "dockerd with runsc is needed: {health:?}"
    );
    let (mut raw, mut full, mut added) = (vec![], vec![], vec![]);
    let (mut before, mut sandbox, mut after) = (vec![], vec![], vec![]);
    let (mut failures, mut other_limits) = (0, 0);
    for _ in 0..runs {
        let (plan, job, control) = baseline_spec(init, limits, dirs.path());
        let started = Instant::now();
        let (outcome, ran_in) = match docker.start(plan).await {
            Ok(mut sandbox) => (sandbox.run(job, control).await, Some(sandbox)),
            Err(err) => (Err(err), None),
        };
        // As on the gateway's path: the stopped container is removed after the answer.
        let raw_ms = ms(started.elapsed());
        if let Some(sandbox) = ran_in {
            sandbox.discard().await;
        }
        match outcome {
            Ok(run) if run.ending == Ending::Exited(0) && run.stdout.text() == "1\n" => {}
            other => {
                failures += 1;
                eprintln!("baseline run failed: {other:?}");
            }
        }
        let sent = Utc::now();
        let started = Instant::now();
        let (status, body) = gw.execute(key).await;
        let full_ms = ms(started.elapsed());
        if status != 200 || body["status"] != "succeeded" || body["stdout"] != "1\n" {
            failures += 1;
            eprintln!("gateway run failed: {status} {body}");
        }
        if serde_json::from_value::<Limits>(body["limits"].clone())
            .ok()
            .as_ref()
            != Some(limits)
        {
            other_limits += 1;
        }
        if let Some(p) = phases(sent, Utc::now(), &body) {
            before.push(p.before);
            sandbox.push(p.sandbox);
            after.push(p.after);
        }
        raw.push(raw_ms);
        full.push(full_ms);
        added.push(full_ms - raw_ms);
    }
    report_cold(runs, [raw, full, added], [before, sandbox, after]);
    println!(
        "  limits: {} ({} ms timeout, {} MB, {} cpus, {} pids); failed runs: {failures}",
        if other_limits == 0 {
            "the baseline's in every gateway run".to_owned()
        } else {
            format!("DIFFERENT from the baseline's in {other_limits} gateway runs")
        },
        limits.timeout_ms,
        limits.memory_mb,
        limits.cpus,
        limits.pids
    );
    failures == 0
}

fn report_cold(runs: usize, [raw, full, added]: [Vec<f64>; 3], phases: [Vec<f64>; 3]) {
    let (raw, full, added) = (Series::new(raw), Series::new(full), Series::new(added));
    println!(
        "cold execution, python print(1) under runsc, {runs} runs each, alternating, no warm-up"
    );
    println!("  raw Docker API (DockerRuntime)     {}", raw.line());
    println!("  sandgate POST /v1/executions wait  {}", full.line());
    let ratio = |p| full.percentile(p) / raw.percentile(p);
    println!(
        "  ratio sandgate / raw: p50 {:.3}x (target <= 1.10), p90 {:.3}x, p99 {:.3}x",
        ratio(50),
        ratio(90),
        ratio(99)
    );
    println!("  gateway adds, per pair of runs:   {}", added.line());
    let [before, sandbox, after] = phases.map(Series::new);
    if before.0.is_empty() {
        return;
    }
    println!("  where a gateway run's time goes (from its record's timestamps), p50:");
    for (what, series) in [
        (
            "request -> running (HTTP, auth, decision, audit commit)",
            before,
        ),
        (
            "running -> completed (output area, sandbox, collection, completion)",
            sandbox,
        ),
        ("completed -> response read", after),
    ] {
        println!("    {what:<70} {:>7.1} ms", series.percentile(50));
    }
}

/// Target 2: concurrent executions, their audit events, the chain. False on any loss or error.
async fn concurrent(gw: &Gateway, key: &str, store: &AuditStore, pool: &PgPool) -> bool {
    let count = env_usize("SANDGATE_BENCH_CONCURRENT", 16);
    let started = Instant::now();
    let results = futures_util::future::join_all((0..count).map(|_| async {
        let started = Instant::now();
        let result = gw.execute(key).await;
        (result, ms(started.elapsed()))
    }))
    .await;
    let wall = started.elapsed();
    let ids: Vec<String> = results
        .iter()
        .filter_map(|((_, body), _)| body["id"].as_str().map(str::to_owned))
        .collect();
    let succeeded = results
        .iter()
        .filter(|((status, body), _)| {
            *status == 200 && body["status"] == "succeeded" && body["stdout"] == "1\n"
        })
        .count();
    let latency = Series::new(results.iter().map(|(_, ms)| *ms).collect());
    println!(
        "{count} concurrent executions on {} cores (max_concurrent {}): wall {:.2} s, \
         {succeeded}/{count} succeeded, per request {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        gw.config.max_concurrent,
        wall.as_secs_f64(),
        latency.line()
    );
    for ((status, body), _) in results
        .iter()
        .filter(|((s, b), _)| *s != 200 || b["status"] != "succeeded")
    {
        println!("  failed: {status} {body}");
    }
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'execution.decision' \
         AND execution_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(pool)
    .await
    .unwrap();
    let verification = store.verify_chain().await.unwrap();
    let pass = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let all_ran = succeeded == count;
    let all_recorded = ids.len() == count && events == count as i64;
    println!(
        "  {}: {succeeded} of {count} executions succeeded",
        pass(all_ran)
    );
    println!(
        "  {}: {events} execution.decision audit events for the {} ids returned (expected {count})",
        pass(all_recorded),
        ids.len()
    );
    println!(
        "  {}: audit chain {}",
        pass(verification.ok()),
        verification.summary()
    );
    all_ran && all_recorded && verification.ok()
}
