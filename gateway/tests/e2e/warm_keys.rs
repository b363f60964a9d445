//! Refill by restore for every key the pool serves (issue 26 items 1 and 6; app/pool_restore.rs),
//! through the real stack: PostgreSQL, runsc and the private experimental dockerd of
//! `warm_restore` (the machine's daemon is never reconfigured). A bash execution key, a Python
//! session key and an E2B sandbox's session key each refill by restoring their template, and
//! what they serve is warm and correct; a restored sandbox of a small shape keeps its limits
//! exactly (a 128 MB memory bomb ends `oom`, the pids limit holds).

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::TestGateway;
use serde_json::{json, Value};

use crate::warm_restore::{restored_containers, shared_daemon, PrivateDockerd};
use gateway::runtime::docker::DockerRuntime;

/// A gateway on the experimental daemon with snapshots on, one bash sandbox of the default
/// shape kept waiting, Python preloading `json`.
async fn gateway_on(daemon: &PrivateDockerd) -> TestGateway {
    let url = common::fresh_database().await;
    let data_dir = tempfile::tempdir().unwrap();
    TestGateway::start_on(
        DockerRuntime::at(&daemon.socket()),
        Some(url),
        data_dir,
        |config| {
            config.snapshots.enabled = true;
            // What is tested is the restored sandbox; on a loaded machine a restore can take
            // longer than a boot, which would send the key back to booting mid-test.
            config.snapshots.restore_even_if_slower = true;
            config.warm_pool = BTreeMap::from([("bash".to_owned(), 1)]);
            config.python_preload = vec!["json".to_owned()];
            config.max_sessions = 6;
        },
    )
    .await
}

/// Waits (up to four minutes) until a key matching `wanted` has a sandbox waiting and refills
/// by restore with its template made; returns it.
async fn restoring(gw: &TestGateway, wanted: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..2400 {
        let keys = common::warm::pool_keys(&gw.http, &gw.url).await;
        if let Some(key) = keys.into_iter().find(|k| {
            wanted(k)
                && k["waiting"].as_u64() > Some(0)
                && k["refill"]["by"] == "restore"
                && k["refill"]["template_bytes"].as_u64() > Some(0)
        }) {
            return key;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no matching key refilled by restore: {:?}",
        common::warm::pool_keys(&gw.http, &gw.url).await
    );
}

fn serving(language: &'static str, serves: &'static str) -> impl Fn(&Value) -> bool {
    move |k: &Value| k["language"] == language && k["serves"] == serves
}

#[tokio::test(flavor = "multi_thread")]
async fn bash_python_session_and_e2b_keys_refill_by_restore_and_serve_warm() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let instance = gw.instance().await;
    let agent = gw.key("agent", "acme").await;

    // bash: the floor's key; what waits was restored from its template.
    restoring(&gw, serving("bash", "execution")).await;
    assert!(
        !restored_containers(&daemon, &instance).is_empty(),
        "no waiting container was restored"
    );
    let (status, record) = gw
        .execute(&agent, "bash", "echo hi; echo $((6 * 7))", json!({}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["stdout"], "hi\n42\n", "{record}");

    // A Python session: the first is cold and makes its key wanted, the next is restored.
    let open = || async {
        let (status, session) = gw
            .post(&agent, "/v1/sessions", &json!({"language": "python"}))
            .await;
        assert_eq!(status, 201, "{session}");
        session
    };
    let first = open().await;
    assert_eq!(first["start"], "cold", "{first}");
    let id = first["id"].as_str().unwrap();
    assert_eq!(
        gw.delete(&agent, &format!("/v1/sessions/{id}")).await.0,
        200
    );
    restoring(&gw, serving("python", "session")).await;
    let second = open().await;
    assert_eq!(second["start"], "warm", "{second}");
    let path = format!("/v1/sessions/{}/executions", second["id"].as_str().unwrap());
    let (status, cell) = gw.post(&agent, &path, &json!({"code": "x = 41"})).await;
    assert_eq!(status, 200, "{cell}");
    let (_, cell) = gw.post(&agent, &path, &json!({"code": "x + 1"})).await;
    assert_eq!(cell["result"], "42", "{cell}");

    // An E2B sandbox is a session created through the pool: the second one is restored.
    let first = common::e2b_agent(E2B_AGENT, &gw.url, &agent, &[]).await;
    assert_eq!(first["echo"], "hi\n", "{first}");
    restoring(&gw, serving("bash", "session")).await;
    let second = common::e2b_agent(E2B_AGENT, &gw.url, &agent, &[]).await;
    assert_eq!(second["echo"], "hi\n", "{second}");
    for (said, start) in [(&first, "cold"), (&second, "warm")] {
        let id = said["id"].as_str().unwrap();
        let (_, row) = gw.get(&agent, &format!("/v1/sessions/{id}")).await;
        assert_eq!(row["start"], start, "{said} {row}");
    }
    gw.stop().await;
}

/// Opens a `base` (bash) sandbox through E2B's SDK, runs `echo hi`, kills it.
const E2B_AGENT: &str = r#"
import json
from e2b import Sandbox
sbx = Sandbox.create(template="base", timeout=60)
out = {"id": sbx.sandbox_id, "echo": sbx.commands.run("echo hi").stdout}
sbx.kill()
print(json.dumps(out))
"#;

const BOMB: &str = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))";

/// Forks until refused (the pids limit), counting the children.
const FORKS: &str = r#"
import os
children = 0
try:
    while children < 1000:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "30"])
        children += 1
except OSError as err:
    print("fork refused", err.errno)
print("children", children, flush=True)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_restored_sandbox_of_a_small_shape_keeps_its_memory_and_pids_limits() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let instance = gw.instance().await;
    let agent = gw.key("agent", "acme").await;
    let small =
        json!({"limits": {"memory_mb": 128, "cpus": 0.5, "pids": 256, "timeout_ms": 20000}});
    let shape = |k: &Value| serving("python", "execution")(k) && k["memory_mb"] == 128;
    let (status, first) = gw
        .execute(&agent, "python", "print(1)", small.clone())
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["start"], "cold", "{first}");
    let key = restoring(&gw, shape).await;
    assert_eq!(key["pids"], 256, "{key}");
    assert!(!restored_containers(&daemon, &instance).is_empty());
    let (status, bomb) = gw.execute(&agent, "python", BOMB, small.clone()).await;
    assert_eq!(status, 200, "{bomb}");
    assert_eq!(bomb["start"], "warm", "{bomb}");
    assert_eq!(bomb["status"], "oom", "{bomb}");
    assert_eq!(bomb["limits"]["memory_mb"], 128, "{bomb}");
    restoring(&gw, shape).await;
    let (status, forks) = gw.execute(&agent, "python", FORKS, small).await;
    assert_eq!(status, 200, "{forks}");
    assert_eq!(forks["start"], "warm", "{forks}");
    let children: u32 = forks["stdout"]
        .as_str()
        .unwrap_or("")
        .lines()
        .find_map(|l| l.strip_prefix("children "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX);
    // Every process needs a host stub under runsc's ptrace platform: at the pids limit either
    // fork fails, or gVisor's kernel gives up and the sandbox dies (as in `limits::`).
    let held = (forks["status"] == "succeeded" && children < 256) || forks["status"] == "killed";
    assert!(held, "the pids limit held on a restored sandbox: {forks}");
    gw.stop().await;
}
