//! The warm pool keyed by the whole container, through the real stack (dockerd, runsc,
//! PostgreSQL): shapes the old pool never served (Python under 512 MB, a dataset mount, small
//! pids and disk, sessions) start warm once their key has been claimed, and a claimed sandbox
//! is exactly its decision's container (limits enforced, only the granted dataset mounted).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::TestGateway;

/// A gateway with the pool on (`warm_pool` floors), Python preloading `json` (so the pooled
/// container carries the preload allowance), and optionally the census dataset.
async fn with_pool(floors: &[(&str, usize)], census: Option<&Path>) -> TestGateway {
    let url = common::fresh_database().await;
    let floors: BTreeMap<String, usize> =
        floors.iter().map(|(l, n)| ((*l).to_owned(), *n)).collect();
    let census = census.map(Path::to_owned);
    TestGateway::start_with(Some(url), move |config| {
        config.warm_pool = floors;
        config.python_preload = vec!["json".to_owned()];
        if let Some(path) = census {
            config.datasets.insert(
                "census".to_owned(),
                gateway::config::Dataset {
                    path,
                    description: "census extract".to_owned(),
                },
            );
        }
    })
    .await
}

/// Waits (up to a minute) until `/readyz` lists a key matching `wanted` with a sandbox
/// waiting; returns that key.
async fn waiting_key(gw: &TestGateway, wanted: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..600 {
        let keys = common::warm::pool_keys(&gw.http, &gw.url).await;
        if let Some(key) = keys
            .into_iter()
            .find(|k| wanted(k) && k["waiting"].as_u64() > Some(0))
        {
            return key;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no matching key got a waiting sandbox: {:?}",
        common::warm::pool_keys(&gw.http, &gw.url).await
    );
}

fn python_of(memory_mb: u64) -> impl Fn(&Value) -> bool {
    move |k: &Value| {
        k["language"] == "python"
            && k["serves"] == "execution"
            && k["memory_mb"] == memory_mb
            && k["mounts"].as_array().is_some_and(Vec::is_empty)
    }
}

/// This gateway's waiting (pool-labelled) containers for `language`.
async fn pooled(gw: &TestGateway, language: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args([
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=sandgate.pool={language}"),
            "--filter",
            &format!("label=sandgate.instance={}", gw.instance().await),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn inspect(container: &str) -> Value {
    let output = Command::new("docker")
        .args(["inspect", container])
        .output()
        .unwrap();
    let all: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    all[0].clone()
}

async fn scrape(gw: &TestGateway) -> String {
    let auditor = gw.key("auditor", "acme").await;
    gw.http
        .get(format!("{}/metrics", gw.url))
        .bearer_auth(auditor)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

const BOMB: &str = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))";

#[tokio::test(flavor = "multi_thread")]
async fn memory_bombs_at_256_and_128_mb_end_oom_on_warm_sandboxes_of_their_key() {
    let gw = with_pool(&[("python", 1)], None).await;
    let key = gw.key("agent", "acme").await;
    for memory_mb in [256_u64, 128] {
        let limits = json!({"limits": {"memory_mb": memory_mb}});
        // The first claim of a new key runs cold and makes the key wanted.
        let (status, first) = gw.execute(&key, "python", "print(1)", limits.clone()).await;
        assert_eq!(status, 200, "{first}");
        assert_eq!(first["start"], "cold", "{first}");
        waiting_key(&gw, python_of(memory_mb)).await;
        // The waiting container: the decision's memory plus the preload allowance, swap none.
        let containers: Vec<Value> = pooled(&gw, "python")
            .await
            .iter()
            .map(|c| inspect(c))
            .collect();
        let wanted = i64::try_from((memory_mb + 192) * 1024 * 1024).unwrap();
        assert!(
            containers
                .iter()
                .any(|c| c["HostConfig"]["Memory"] == json!(wanted)),
            "no pooled container of {memory_mb} MB + 192 MB preload: {:?}",
            containers
                .iter()
                .map(|c| &c["HostConfig"]["Memory"])
                .collect::<Vec<_>>()
        );
        let (status, bomb) = gw.execute(&key, "python", BOMB, limits).await;
        assert_eq!(status, 200, "{bomb}");
        assert_eq!(bomb["start"], "warm", "{bomb}");
        assert_eq!(bomb["status"], "oom", "{bomb}");
        assert_eq!(bomb["limits"]["memory_mb"], json!(memory_mb), "{bomb}");
    }
    let text = scrape(&gw).await;
    for line in [
        "sandgate_warm_claims_total{language=\"python\",result=\"hit\"} 2\n",
        "sandgate_warm_claims_total{language=\"python\",result=\"miss_new_key\"} 2\n",
        "sandgate_warm_waiting_memory_bytes ",
        "sandgate_warm_waiting{language=\"python\"} ",
    ] {
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }
    gw.stop().await;
}

fn census_dir() -> tempfile::TempDir {
    let dataset = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dataset.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(dataset.path().join("people.csv"), "name,age\nada,36\n").unwrap();
    dataset
}

const LOOK_AT_DATA: &str = r#"
import os
print(sorted(os.listdir("/data")) if os.path.isdir("/data") else "no /data")
if os.path.isdir("/data/census"):
    print(open("/data/census/people.csv").read().splitlines()[1])
    try:
        open("/data/census/people.csv", "a").write("x")
        print("wrote")
    except OSError as err:
        print("refused", type(err).__name__)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_research_sandbox_sees_only_its_dataset_and_no_other_grant_claims_it() {
    let census = census_dir();
    let gw = with_pool(&[("bash", 1)], Some(census.path())).await;
    let key = gw.key("agent", "acme").await;
    let granted = json!({"mounts": ["dataset:census"]});
    let (_, first) = gw
        .execute(&key, "python", LOOK_AT_DATA, granted.clone())
        .await;
    assert_eq!(first["start"], "cold", "{first}");
    let is_census = |k: &Value| {
        k["language"] == "python"
            && k["mounts"]
                .as_array()
                .is_some_and(|m| m.len() == 1 && m[0]["target"] == "/data/census")
    };
    waiting_key(&gw, is_census).await;
    // The waiting sandbox has exactly that mount, read-only, and nothing else under /data.
    let waiting = pooled(&gw, "python").await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let mounts = inspect(&waiting[0])["Mounts"].clone();
    let data: Vec<&Value> = mounts
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["Destination"].as_str().unwrap_or("").starts_with("/data"))
        .collect();
    assert_eq!(data.len(), 1, "{mounts}");
    assert_eq!(data[0]["Destination"], "/data/census", "{mounts}");
    assert_eq!(data[0]["RW"], false, "{mounts}");

    // A decision without the grant does not claim it: it runs elsewhere and sees no dataset.
    let (_, other) = gw.execute(&key, "python", LOOK_AT_DATA, json!({})).await;
    assert_eq!(other["status"], "succeeded", "{other}");
    assert_eq!(other["stdout"], "no /data\n", "{other}");
    assert!(
        pooled(&gw, "python").await.contains(&waiting[0]),
        "the census sandbox was taken by a decision without the grant"
    );

    // The granted decision claims it: only its dataset, read-only.
    let (_, warm) = gw.execute(&key, "python", LOOK_AT_DATA, granted).await;
    assert_eq!(warm["start"], "warm", "{warm}");
    assert_eq!(
        warm["stdout"], "['census']\nada,36\nrefused PermissionError\n",
        "{warm}"
    );
    gw.stop().await;
}

const PIDS_AND_DISK: &str = r#"
import os
try:
    with open("/workspace/big", "wb") as out:
        for _ in range(64):
            out.write(b"\0" * (1024 * 1024))
            out.flush()
    print("wrote 64 MB", flush=True)
except OSError as err:
    print("disk", err.errno, flush=True)
os.remove("/workspace/big")
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
async fn pids_and_disk_are_enforced_on_a_warm_sandbox_of_a_small_shape() {
    let gw = with_pool(&[("bash", 1)], None).await;
    let key = gw.key("agent", "acme").await;
    let small = json!({"limits": {"memory_mb": 256, "cpus": 0.5, "pids": 256, "disk_mb": 16,
        "timeout_ms": 20000}});
    let (_, first) = gw.execute(&key, "python", "print(1)", small.clone()).await;
    assert_eq!(first["start"], "cold", "{first}");
    waiting_key(&gw, |k| {
        python_of(256)(k) && k["disk_mb"] == 16 && k["pids"] == 256 && k["cpus"] == json!(0.5)
    })
    .await;
    let (status, warm) = gw.execute(&key, "python", PIDS_AND_DISK, small).await;
    assert_eq!(status, 200, "{warm}");
    assert_eq!(warm["start"], "warm", "{warm}");
    let stdout = warm["stdout"].as_str().unwrap_or("");
    // ENOSPC (28) at the 16 MB tmpfs.
    assert!(
        stdout.starts_with("disk 28\n"),
        "the disk limit held: {warm}"
    );
    // Every process needs a host stub under runsc's ptrace platform: at the pids limit either
    // fork fails, or gVisor's kernel gives up and the sandbox dies (as in `limits::`).
    let children: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("children "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX);
    let held = (warm["status"] == "succeeded" && children < 256) || warm["status"] == "killed";
    assert!(held, "the pids limit held: {warm}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_created_from_the_pool_says_so_and_works() {
    let gw = with_pool(&[("bash", 1)], None).await;
    let key = gw.key("agent", "acme").await;
    let open = || async {
        let (status, session) = gw
            .post(&key, "/v1/sessions", &json!({"language": "python"}))
            .await;
        assert_eq!(status, 201, "{session}");
        session
    };
    let first = open().await;
    assert_eq!(first["start"], "cold", "{first}");
    let id = first["id"].as_str().unwrap();
    assert_eq!(gw.delete(&key, &format!("/v1/sessions/{id}")).await.0, 200);
    waiting_key(&gw, |k| {
        k["language"] == "python" && k["serves"] == "session"
    })
    .await;
    let second = open().await;
    assert_eq!(second["start"], "warm", "{second}");
    let id = second["id"].as_str().unwrap();
    let (_, stored) = gw.get(&key, &format!("/v1/sessions/{id}")).await;
    assert_eq!(stored["start"], "warm", "{stored}");
    let path = format!("/v1/sessions/{id}/executions");
    let (status, cell) = gw.post(&key, &path, &json!({"code": "x = 41"})).await;
    assert_eq!(status, 200, "{cell}");
    assert_eq!(cell["status"], "succeeded", "{cell}");
    let (_, cell) = gw.post(&key, &path, &json!({"code": "x + 1"})).await;
    assert_eq!(cell["result"], "42", "{cell}");
    gw.stop().await;
}
