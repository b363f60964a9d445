//! The warm pool's refill by restore (issue 26 item 6; app/pool_restore.rs) through the real
//! stack: PostgreSQL, runsc and a private dockerd in experimental mode (its checkpoint API; the
//! machine's shared daemon is not experimental and is never reconfigured). A Python key with a
//! preload refills by restoring its template's checkpoint into fresh containers: what they
//! serve is correct and warm, two restored siblings share nothing written nor their random
//! generators, a memory bomb ends `oom`, and a template whose bytes changed is refused (the key
//! boots instead). The daemon is shared by this area's tests while any of them runs.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use common::TestGateway;
use serde_json::{json, Value};

// The helper serves dockerd_restart.rs too, which uses the rest of it; snapshots.rs loads it as
// well (its module is private to that area, and this area keeps a daemon of its own).
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../dockerd_restart/daemon.rs"]
mod daemon;

pub(crate) use daemon::PrivateDockerd;
use gateway::runtime::docker::DockerRuntime;

static DAEMON: Mutex<Weak<PrivateDockerd>> = Mutex::new(Weak::new());

/// The area's experimental dockerd, started (with the python and bash images) by the first
/// test that needs it and stopped when the last one holding it ends (`warm_keys` uses it too).
pub(crate) async fn shared_daemon() -> Arc<PrivateDockerd> {
    tokio::task::spawn_blocking(|| {
        let mut slot = DAEMON
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(daemon) = slot.upgrade() {
            return daemon;
        }
        let daemon = PrivateDockerd::start_experimental();
        daemon.load_image("sandgate/python");
        daemon.load_image("sandgate/bash");
        let daemon = Arc::new(daemon);
        *slot = Arc::downgrade(&daemon);
        daemon
    })
    .await
    .unwrap()
}

/// A gateway on the experimental daemon with snapshots on, two Python sandboxes of the default
/// shape kept waiting, the preload importing `random` and numpy (each seeds a generator).
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
            config.warm_pool = BTreeMap::from([("python".to_owned(), 2)]);
            config.python_preload = vec!["random".to_owned(), "numpy".to_owned()];
        },
    )
    .await
}

/// The default Python key as `/readyz` lists it.
async fn python_key(gw: &TestGateway) -> Value {
    common::warm::pool_keys(&gw.http, &gw.url)
        .await
        .into_iter()
        .find(|k| k["language"] == "python" && k["serves"] == "execution")
        .unwrap_or(Value::Null)
}

/// Waits (up to three minutes) until the Python key has `count` sandboxes waiting and refills
/// as `by` says; returns the key.
async fn settled(gw: &TestGateway, count: u64, by: &str) -> Value {
    for _ in 0..1800 {
        let key = python_key(gw).await;
        if key["waiting"].as_u64() >= Some(count) && key["refill"]["by"] == by {
            return key;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the python key never settled: {}", python_key(gw).await);
}

/// The templates' images of this gateway.
fn templates(gw: &TestGateway, instance: &str) -> Vec<PathBuf> {
    let dir = gw
        .data_dir
        .path()
        .join("snapshots")
        .join(format!("pool-{instance}"));
    std::fs::read_dir(&dir)
        .map(|entries| entries.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

/// Names of this gateway's waiting containers on the daemon that were restored from a
/// checkpoint (dockerd holds the image in the container's own checkpoint directory).
pub(crate) fn restored_containers(daemon: &PrivateDockerd, instance: &str) -> Vec<String> {
    let data = daemon.socket().with_file_name("data");
    let filter = format!("label=sandgate.instance={instance}");
    let out = daemon.docker(&["ps", "-q", "--no-trunc", "--filter", &filter]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|id| {
            data.join("containers")
                .join(id)
                .join("checkpoints")
                .join("sandgate")
                .is_dir()
        })
        .map(str::to_owned)
        .collect()
}

const MARK_AND_DRAW: &str = r#"
import os, random, numpy
seen = [p for p in ("/tmp/sibling-mark", "/workspace/sibling-mark") if os.path.exists(p)]
for p in ("/tmp/sibling-mark", "/workspace/sibling-mark"):
    open(p, "w").write("written by one sibling")
print("seen", seen)
print("draw", random.getrandbits(64), int(numpy.random.randint(0, 2**62)))
print(1)
"#;

const BOMB: &str = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))";

fn line_of<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in {stdout:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn restored_siblings_run_correctly_warm_share_nothing_and_end_oom_under_a_bomb() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let instance = gw.instance().await;
    let key = settled(&gw, 2, "restore").await;
    assert!(
        key["refill"]["template_bytes"].as_u64() > Some(0),
        "no template was made: {key}"
    );
    assert_eq!(templates(&gw, &instance).len(), 1, "one template per key");
    let restored = restored_containers(&daemon, &instance);
    assert_eq!(
        restored.len(),
        2,
        "both waiting sandboxes restored: {restored:?}"
    );
    let agent = gw.key("agent", "acme").await;
    let mut draws = Vec::new();
    for _ in 0..2 {
        let (status, record) = gw.execute(&agent, "python", MARK_AND_DRAW, json!({})).await;
        assert_eq!(status, 200, "{record}");
        assert_eq!(record["start"], "warm", "{record}");
        assert_eq!(record["status"], "succeeded", "{record}");
        let stdout = record["stdout"].as_str().unwrap();
        assert!(stdout.ends_with("\n1\n"), "{stdout:?}");
        // Nothing one sibling wrote reaches the other (each restore is its own copy).
        assert_eq!(line_of(stdout, "seen"), "seen []", "{stdout:?}");
        draws.push(line_of(stdout, "draw").to_owned());
    }
    // The template's generators were reseeded per job: siblings draw different numbers.
    assert_ne!(
        draws[0], draws[1],
        "two restored siblings drew the same numbers"
    );
    settled(&gw, 1, "restore").await;
    assert!(!restored_containers(&daemon, &instance).is_empty());
    let (status, bomb) = gw.execute(&agent, "python", BOMB, json!({})).await;
    assert_eq!(status, 200, "{bomb}");
    assert_eq!(bomb["start"], "warm", "{bomb}");
    assert_eq!(bomb["status"], "oom", "{bomb}");
    let data = gw.stop_keeping_data().await;
    let dir = data
        .path()
        .join("snapshots")
        .join(format!("pool-{instance}"));
    assert!(!dir.exists(), "a template outlived the gateway");
}

/// Flips one byte of the template's largest file.
fn corrupt(image: &Path) {
    let largest = std::fs::read_dir(image)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&largest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&largest, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_template_is_refused_and_the_key_boots_instead() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let instance = gw.instance().await;
    settled(&gw, 2, "restore").await;
    let images = templates(&gw, &instance);
    assert_eq!(images.len(), 1, "{images:?}");
    corrupt(&images[0]);
    let agent = gw.key("agent", "acme").await;
    let (status, record) = gw.execute(&agent, "python", "print(1)", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["stdout"], "1\n", "{record}");
    // The refill after that claim checks the image, refuses it and boots the sandbox instead.
    let key = settled(&gw, 2, "boot").await;
    let cause = key["refill"]["restore_failed"].as_str().unwrap_or_default();
    assert!(cause.contains("sha256"), "{key}");
    assert!(
        templates(&gw, &instance).is_empty(),
        "the refused image was kept"
    );
    let (_, record) = gw.execute(&agent, "python", "print(2)", json!({})).await;
    assert_eq!(record["stdout"], "2\n", "{record}");
    assert_eq!(record["start"], "warm", "{record}");
    gw.stop().await;
}
