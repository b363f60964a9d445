//! The E2B-compatible API (`/e2b`, docs/e2b.md) through E2B's own Python SDKs, against the
//! same work through sandgate's own API (`/v1/sessions`), in one run (issue 23 item 7).
//! Measured, not asserted, except that a failed call makes the run exit non-zero.
//!
//! 1. `Sandbox.create()` + `commands.run("echo hi")` (template `base`, a bash session) against
//!    `POST /v1/sessions` (bash) + one session execution `echo hi`.
//! 2. `Sandbox.create()` + `run_code("1+1")` (`e2b_code_interpreter`, a Python session)
//!    against `POST /v1/sessions` (python) + one session execution `1+1`.
//! 3. The SDK's per-call overhead on a live sandbox: `commands.run("true")` against a session
//!    execution `true` in an open bash session.
//!
//! Both sides are timed by the same Python process (`time.perf_counter`), sandgate's API with
//! one keep-alive `httpx` client (the SDKs use httpx too), alternating run by run so drift hits
//! both. A sandbox's kill or a session's close follows each run, untimed. The first run of each
//! series is a warm-up, not counted. Sessions start cold (no warm pool) unless
//! `SANDGATE_BENCH_WARM_POOL=n` keeps n sandboxes per language waiting.
//!
//! `make bench`, or `cargo bench -p gateway --bench e2b` as root after `make build`, with the
//! Python test environment of scripts/setup.sh (`SANDGATE_PY_VENV`, default `target/py`).
//! `SANDGATE_BENCH_RUNS` sets the runs of series 1 and 2 (default 20), 5x that for series 3.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde_json::Value;

use gateway::audit::AuditStore;

mod common;
use common::{
    bench_main, env_usize, private_postgres, sandbox_init, workspace_root, Gateway, Series,
    DATABASE,
};

/// The driver: prints one JSON object of series name -> samples in milliseconds.
const DRIVER: &str = r#"
import json, os, time
import httpx
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeInterpreter

runs, calls = int(os.environ["RUNS"]), int(os.environ["CALLS"])
own = httpx.Client(base_url=os.environ["GATEWAY"], timeout=120,
                   headers={"Authorization": "Bearer " + os.environ["E2B_API_KEY"]})
samples = {name: [] for name in ["e2b_echo", "own_echo", "e2b_code", "own_code", "e2b_call", "own_call"]}

def own_open(language):
    r = own.post("/v1/sessions", json={"language": language})
    body = r.json()
    assert r.status_code == 201 and body["status"] == "ready", (r.status_code, body)
    return body["id"]

def own_run(session, code):
    r = own.post(f"/v1/sessions/{session}/executions", json={"code": code})
    body = r.json()
    assert r.status_code in (200, 201) and body["status"] == "succeeded", (r.status_code, body)
    return body

def own_close(session):
    assert own.delete(f"/v1/sessions/{session}").status_code in (200, 204)

def timed(name, counted, fn):
    began = time.perf_counter()
    cleanup = fn()
    elapsed = (time.perf_counter() - began) * 1000
    if counted:
        samples[name].append(elapsed)
    if cleanup:
        cleanup()

def e2b_echo():
    sbx = Sandbox.create(template="base")
    assert sbx.commands.run("echo hi").stdout == "hi\n"
    return sbx.kill

def own_echo():
    session = own_open("bash")
    assert own_run(session, "echo hi")["stdout"] == "hi\n"
    return lambda: own_close(session)

def e2b_code():
    sbx = CodeInterpreter.create()
    assert sbx.run_code("1+1").text == "2"
    return sbx.kill

def own_code():
    session = own_open("python")
    own_run(session, "1+1")
    return lambda: own_close(session)

for run in range(runs + 1):
    for name, fn in [("e2b_echo", e2b_echo), ("own_echo", own_echo), ("e2b_code", e2b_code), ("own_code", own_code)]:
        timed(name, run > 0, fn)

sbx = Sandbox.create(template="base")
session = own_open("bash")
for call in range(calls + 1):
    timed("e2b_call", call > 0, lambda: sbx.commands.run("true") and None)
    timed("own_call", call > 0, lambda: own_run(session, "true") and None)
sbx.kill()
own_close(session)
print(json.dumps(samples))
"#;

fn main() -> ExitCode {
    bench_main("sge2b", tracing::Level::WARN, |root| async move {
        run(&root).await
    })
}

async fn run(root: &Path) -> bool {
    let (pg, url) = private_postgres(root).await;
    let runs = env_usize("SANDGATE_BENCH_RUNS", 20);
    let calls = runs * 5;
    let warm = env_usize("SANDGATE_BENCH_WARM_POOL", 0);
    let gw = Gateway::start(url, &root.join("gw"), &sandbox_init(), |config| {
        if warm > 0 {
            config.warm_pool = [("python".to_owned(), warm), ("bash".to_owned(), warm)].into();
        }
    })
    .await;
    let store = AuditStore::new(
        gateway::database::pool(pg.0.connect_options(DATABASE))
            .await
            .unwrap(),
    );
    let key = store.create_key("agent", "acme").await.unwrap().secret;
    let samples = drive(&gw.url, &key, runs, calls).await;
    gw.stop().await;
    let Some(samples) = samples else {
        return false;
    };
    let series = |name: &str| {
        let values = samples[name].as_array().unwrap();
        Series::new(values.iter().map(|v| v.as_f64().unwrap()).collect())
    };
    let pool = match warm {
        0 => "cold sessions, no warm pool".to_owned(),
        n => format!("warm pool of {n} per language"),
    };
    println!("E2B SDK vs sandgate's API ({runs} runs, {calls} calls; {pool})");
    compare(
        "create + commands.run(\"echo hi\")",
        "session (bash) + `echo hi`",
        &series("e2b_echo"),
        &series("own_echo"),
    );
    compare(
        "create + run_code(\"1+1\")",
        "session (python) + `1+1`",
        &series("e2b_code"),
        &series("own_code"),
    );
    compare(
        "live: commands.run(\"true\")",
        "live: session execution `true`",
        &series("e2b_call"),
        &series("own_call"),
    );
    true
}

/// One E2B series against sandgate's, with the ratios of their p50 and p99.
fn compare(e2b_name: &str, own_name: &str, e2b: &Series, own: &Series) {
    println!("  E2B SDK   {e2b_name:<36} {}", e2b.line());
    println!("  sandgate  {own_name:<36} {}", own.line());
    println!(
        "  E2B / sandgate  p50 {:.2}x  p99 {:.2}x  (p50 overhead {:+.1} ms)",
        e2b.percentile(50) / own.percentile(50),
        e2b.percentile(99) / own.percentile(99),
        e2b.percentile(50) - own.percentile(50)
    );
}

/// Runs [`DRIVER`] with the SDKs pointed at the gateway; its samples, or `None` if it failed.
async fn drive(url: &str, key: &str, runs: usize, calls: usize) -> Option<Value> {
    let python = python_venv().join("bin/python");
    let (url, key) = (url.to_owned(), key.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", DRIVER])
            .env("E2B_API_URL", format!("{url}/e2b"))
            .env("E2B_SANDBOX_URL", format!("{url}/e2b"))
            .env("E2B_API_KEY", &key)
            .env("GATEWAY", &url)
            .env("RUNS", runs.to_string())
            .env("CALLS", calls.to_string())
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        eprintln!(
            "the E2B driver failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).ok()
}

/// The Python environment with `e2b` and `e2b-code-interpreter` (scripts/setup.sh makes it).
fn python_venv() -> PathBuf {
    let venv = std::env::var_os("SANDGATE_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/py"));
    assert!(
        venv.join("bin/python").is_file(),
        "no Python environment at {}: run `bash scripts/setup.sh`, or set SANDGATE_PY_VENV",
        venv.display()
    );
    venv
}
