//! Sessions (DESIGN.md section 10), measured against cold executions in the same run.
//! Measured, not asserted, except that a failed execution makes the run exit non-zero.
//!
//! 1. `x + 1` in an open Python session against `print(1)` as a cold execution: goal p50
//!    <= 0.1x.
//! 2. The analysis loop: load a CSV once, then 5 pandas steps in the same session, against the
//!    same 5 steps as cold executions (each one loading the CSV and importing pandas again).
//!
//! `make bench`, or `cargo bench -p gateway --bench session` as root after `make build`.
//! `SANDGATE_BENCH_RUNS` sets the runs of series 1 (default 20).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use base64::Engine as _;
use serde_json::{json, Value};

use gateway::audit::AuditStore;

mod common;
use common::{
    bench_main, env_usize, ms, private_postgres, sandbox_init, Gateway, Series, DATABASE,
};

const LOAD: &str = "import pandas as pd\nframe = pd.read_csv('sales.csv')";
const STEPS: [&str; 5] = [
    "frame = frame.dropna()",
    "frame['month'] = pd.to_datetime(frame['month'])",
    "frame['double'] = frame['amount'] * 2",
    "trend = frame.groupby('month')['amount'].sum()",
    "float(trend.sum())",
];

fn main() -> ExitCode {
    bench_main("sgsess", tracing::Level::WARN, |root| async move {
        run(&root).await
    })
}

async fn run(root: &Path) -> bool {
    let (pg, url) = private_postgres(root).await;
    let runs = env_usize("SANDGATE_BENCH_RUNS", 20);
    // The gateway runs the migrations (which create the role its pool acts as) first.
    let gw = Gateway::start(url, &root.join("gw"), &sandbox_init(), |_| {}).await;
    let store = AuditStore::new(
        gateway::database::pool(pg.0.connect_options(DATABASE))
            .await
            .unwrap(),
    );
    let key = store.create_key("agent", "acme").await.unwrap().secret;
    let mut ok = true;

    let session = open(&gw, &key).await;
    ok &= turn(&gw, &key, &session, "x = 41").await.is_some();
    let (mut in_session, mut cold) = (vec![], vec![]);
    for _ in 0..runs {
        let began = Instant::now();
        ok &= turn(&gw, &key, &session, "x + 1").await.is_some();
        in_session.push(ms(began.elapsed()));
        let began = Instant::now();
        let (status, record) = gw.execute(&key).await;
        cold.push(ms(began.elapsed()));
        ok &= status == 200 && record["status"] == "succeeded";
    }

    let csv = "month,amount\n2026-01-01,10\n2026-02-01,12\n2026-03-01,\n2026-04-01,15\n";
    let upload = json!([{"path": "sales.csv",
        "content_b64": base64::engine::general_purpose::STANDARD.encode(csv)}]);
    let loop_session = open(&gw, &key).await;
    let began = Instant::now();
    ok &= turn_with(&gw, &key, &loop_session, LOAD, upload.clone())
        .await
        .is_some();
    for step in STEPS {
        ok &= turn(&gw, &key, &loop_session, step).await.is_some();
    }
    let session_loop = ms(began.elapsed());
    let began = Instant::now();
    let mut code = LOAD.to_owned();
    for step in STEPS {
        code = format!("{code}\n{step}");
        let body = json!({"language": "python", "code": format!("{code}\nprint('ok')"),
            "files": upload.clone()});
        let (status, record) = gw.run(&key, body).await;
        ok &= status == 200 && record["status"] == "succeeded";
    }
    let cold_loop = ms(began.elapsed());
    gw.stop().await;

    let (in_session, cold) = (Series::new(in_session), Series::new(cold));
    println!("session benchmark ({runs} runs)");
    println!("  x + 1 in an open session   {}", in_session.line());
    println!("  print(1) cold              {}", cold.line());
    println!(
        "  session / cold             p50 {:.3}x (goal <= 0.1x)",
        in_session.percentile(50) / cold.percentile(50)
    );
    println!(
        "  analysis loop (load + 5 pandas steps): session {session_loop:.0} ms, cold {cold_loop:.0} ms ({:.2}x)",
        session_loop / cold_loop
    );
    ok
}

async fn open(gw: &Gateway, key: &str) -> String {
    let opened: Value = gw
        .http
        .post(format!("{}/v1/sessions", gw.url))
        .bearer_auth(key)
        .json(&json!({"language": "python"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(opened["status"], "ready", "{opened}");
    opened["id"].as_str().unwrap().to_owned()
}

async fn turn(gw: &Gateway, key: &str, session: &str, code: &str) -> Option<Value> {
    turn_with(gw, key, session, code, json!([])).await
}

async fn turn_with(
    gw: &Gateway,
    key: &str,
    session: &str,
    code: &str,
    files: Value,
) -> Option<Value> {
    let response = gw
        .http
        .post(format!("{}/v1/sessions/{session}/executions", gw.url))
        .bearer_auth(key)
        .json(&json!({"code": code, "files": files}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let record: Value = response.json().await.unwrap_or(Value::Null);
    if status == 200 && record["status"] == "succeeded" {
        Some(record)
    } else {
        eprintln!("session execution failed: {status} {record}");
        None
    }
}
