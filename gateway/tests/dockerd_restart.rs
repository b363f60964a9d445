//! dockerd restarts under a warm pool (DESIGN 10, issue 10 item 5), on a private dockerd this
//! test starts and SIGKILLs (the machine's daemon is shared by every other suite; it is never
//! touched): while the daemon is down `/readyz` answers 503 with `warm_pool` (and `docker`) not
//! ready and an execution ends at once as a recorded `error` naming the runtime, not a hang;
//! once it is back the pooled sandbox from before is never handed out, executions succeed,
//! the pool refills and readiness returns, and nothing of the gateway's instance is left.
//!
//! SIGKILL rather than SIGTERM: a crash is the harder case. dockerd's managed containerd dies
//! with it, but the containerd shims and runsc processes of running containers survive until
//! dockerd starts again and kills them (it runs without live-restore), and the gateway cannot
//! remove anything while the daemon is away. A SIGTERM would stop the containers first, which
//! is the gentle subset of this.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;
#[path = "dockerd_restart/daemon.rs"]
mod daemon;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use common::TestGateway;
use daemon::PrivateDockerd;
use gateway::runtime::docker::DockerRuntime;

/// How long each phase may take before the test calls it stuck (bounds, not speed goals: the
/// pool's retry back-off grows to 30 s and the gateway's own Docker calls time out at 30 s).
const PHASE: Duration = Duration::from_secs(90);

async fn readyz(gw: &TestGateway) -> (u16, Value) {
    let response = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Polls `/readyz` until `wanted` holds; panics with the last answer after [`PHASE`].
async fn readyz_until(gw: &TestGateway, what: &str, wanted: impl Fn(u16, &Value) -> bool) -> Value {
    let started = std::time::Instant::now();
    loop {
        let (status, body) = readyz(gw).await;
        if wanted(status, &body) {
            return body;
        }
        assert!(
            started.elapsed() < PHASE,
            "/readyz never showed {what}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pool_waiting_one(status: u16, ready: &Value) -> bool {
    status == 200
        && ready["checks"]["warm_pool"]["ok"] == json!(true)
        // Every language with an image is listed (python=0: nothing claimed python here).
        && ready["checks"]["warm_pool"]["detail"]
            .as_str()
            .is_some_and(|detail| detail.split_whitespace().any(|part| part == "bash=1"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dockerd_restart_hands_out_no_dead_pooled_sandbox_and_the_pool_recovers() {
    common::require_docker();
    let mut daemon = tokio::task::spawn_blocking(|| {
        let daemon = PrivateDockerd::start();
        daemon.load_image("sandgate/bash");
        daemon
    })
    .await
    .unwrap();
    let url = common::fresh_database().await;
    let data_dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::start_on(
        DockerRuntime::at(&daemon.socket()),
        Some(url),
        data_dir,
        |config| {
            // bash runs in the python image by default (1.3 GB); the private daemon holds only bash's.
            config.images.insert("bash".into(), "sandgate/bash".into());
            config.warm_pool = BTreeMap::from([("bash".to_owned(), 1)]);
        },
    )
    .await;
    let key = gw.key("agent", "acme").await;
    let instance = gw.instance().await;

    readyz_until(&gw, "the pool waiting", pool_waiting_one).await;
    let before = daemon.containers_of(&instance);
    assert_eq!(before.len(), 1, "one pooled sandbox waits: {before:?}");
    let pooled = before[0].clone();
    assert!(pooled.starts_with("sandgate-sb_"), "{pooled}");

    daemon = tokio::task::spawn_blocking(move || {
        daemon.kill();
        daemon
    })
    .await
    .unwrap();
    let down = readyz_until(&gw, "warm_pool not ready", |status, ready| {
        status == 503 && ready["checks"]["warm_pool"]["ok"] == json!(false)
    })
    .await;
    let missing = down["missing"].to_string();
    assert!(
        missing.contains("docker") && missing.contains("warm_pool"),
        "{down}"
    );
    let detail = down["checks"]["warm_pool"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("bash 512 MB: "),
        "the failing key (language, memory) and cause are named: {detail}"
    );
    // Nothing can run: the answer comes at once, as a recorded runtime error (the record keeps
    // the daemon's words to the gateway's log), not a hang.
    let (status, record) =
        tokio::time::timeout(PHASE, gw.execute(&key, "bash", "echo hi", json!({})))
            .await
            .expect("an execution while dockerd is down answers");
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "error", "{record}");
    assert!(
        record["error"] == "the sandbox could not be run" && record["started_at"].is_null(),
        "{record}"
    );
    assert!(
        record["start"].is_null(),
        "no sandbox started, warm or cold: {record}"
    );

    daemon = tokio::task::spawn_blocking(move || {
        daemon.start_again();
        daemon
    })
    .await
    .unwrap();
    // At once, before the pool refilled: cold, or a sandbox started after the restart.
    let (status, record) = gw.execute(&key, "bash", "echo back", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["stdout"], "back\n", "{record}");
    assert!(
        record["start"] == "cold" || record["start"] == "warm",
        "{record}"
    );
    assert_ne!(
        record["container"],
        pooled.as_str(),
        "the dead pooled sandbox was handed out"
    );

    readyz_until(&gw, "the pool refilled", pool_waiting_one).await;
    let (status, record) = gw.execute(&key, "bash", "echo warm", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["start"], "warm", "{record}");
    assert_ne!(
        record["container"],
        pooled.as_str(),
        "the dead pooled sandbox was handed out"
    );

    // The sandbox dockerd killed at its restart is removed once the daemon is back.
    let started = std::time::Instant::now();
    while daemon.containers_of(&instance).contains(&pooled) {
        assert!(
            started.elapsed() < PHASE,
            "the dead pooled sandbox {pooled} was never removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.stop().await;
    let left = daemon.containers_of(&instance);
    assert!(left.is_empty(), "containers of the instance left: {left:?}");
    tokio::task::spawn_blocking(move || drop(daemon))
        .await
        .unwrap();
}
