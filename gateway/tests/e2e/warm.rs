//! The warm pool through the real stack (dockerd, runsc, PostgreSQL): the resident runners,
//! what a claimed sandbox looks like to its program, and the pool's bad days. The isolation and
//! limit suites themselves run warm too (`SANDGATE_TEST_START=warm`, see `common::warm`).

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::TestGateway;

async fn with_pool(pool: &[(&str, usize)], preload: &[&str]) -> TestGateway {
    let url = common::fresh_database().await;
    let pool: BTreeMap<String, usize> = pool.iter().map(|(l, n)| ((*l).to_owned(), *n)).collect();
    let preload: Vec<String> = preload.iter().map(|m| (*m).to_owned()).collect();
    TestGateway::start_with(Some(url), move |config| {
        config.warm_pool = pool;
        config.python_preload = preload;
    })
    .await
}

/// This gateway's waiting sandboxes for `language` (container ids).
async fn pooled(gw: &TestGateway, language: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args([
            "ps",
            "-q",
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

async fn ready(gw: &TestGateway) -> Value {
    gw.http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_python_program_runs_exactly_as_python3_main_py() {
    let gw = with_pool(&[("python", 1)], &["json"]).await;
    let key = gw.key("agent", "acme").await;
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let code = r#"
import json, os, sys
preloaded = "json" in sys.modules
import helper
print(json.dumps({
    "name": __name__, "file": __file__, "argv": sys.argv, "cwd": os.getcwd(),
    "path0": sys.path[0], "env": dict(os.environ), "helper": helper.VALUE,
    "stdin": sys.stdin.read(), "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
    "preloaded": preloaded, "uid": os.getuid(),
}))
sys.stderr.write("to stderr\n")
raise SystemExit(7)
"#;
    let files = json!([{"path": "helper.py", "content_b64": "VkFMVUUgPSA0Mgo="}]);
    let (status, record) = gw
        .execute(&key, "python", code, json!({"files": files}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["exit_code"], 7, "{record}");
    assert_eq!(record["stderr"], "to stderr\n", "{record}");
    let seen: Value = serde_json::from_str(record["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(seen["name"], "__main__");
    assert_eq!(seen["file"], "/workspace/main.py");
    assert_eq!(seen["argv"], json!(["/workspace/main.py"]));
    assert_eq!(seen["cwd"], "/workspace");
    assert_eq!(
        seen["path0"], "/workspace",
        "uploads import beside the program"
    );
    assert_eq!(seen["helper"], 42);
    assert_eq!(seen["stdin"], "", "stdin is /dev/null");
    assert_eq!(
        seen["preloaded"], true,
        "the waiting interpreter imported the preload"
    );
    assert_ne!(seen["uid"], 0);
    let env: BTreeMap<String, String> = serde_json::from_value(seen["env"].clone()).unwrap();
    let names: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "ALL_PROXY",
            "HOME",
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "LANG",
            "MPLBACKEND",
            "NO_PROXY",
            "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "PATH",
            "PIP_DISABLE_PIP_VERSION_CHECK",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONUNBUFFERED",
            "PYTHONUSERBASE",
            "all_proxy",
            "http_proxy",
            "https_proxy",
            "no_proxy"
        ],
        "exactly the environment the gateway sets (the proxy's too: every sandbox has it, issue 21 item 11)"
    );

    // An uncaught exception: exit 1 and the program's own traceback, nothing of the runner's.
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let (_, record) = gw
        .execute(
            &key,
            "python",
            "def f():\n    raise ValueError('boom')\nf()\n",
            json!({}),
        )
        .await;
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["exit_code"], 1, "{record}");
    let stderr = record["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("Traceback (most recent call last):\n  File \"/workspace/main.py\""),
        "{stderr}"
    );
    assert!(stderr.ends_with("ValueError: boom\n"), "{stderr}");
    assert!(!stderr.contains("runpy"), "{stderr}");

    // A syntax error: reported as python3 reports it, without any runner frame.
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let (_, record) = gw.execute(&key, "python", "x = (\n", json!({})).await;
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["exit_code"], 1, "{record}");
    let stderr = record["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("  File \"/workspace/main.py\", line 1"),
        "{stderr}"
    );
    assert!(stderr.contains("SyntaxError"), "{stderr}");

    // SIGINT's default: KeyboardInterrupt, then death by the signal, as python3 does.
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let (_, record) = gw
        .execute(
            &key,
            "python",
            "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n",
            json!({}),
        )
        .await;
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["exit_code"], 130, "{record}");
    gw.stop().await;
}

/// The runner skips the interpreter's teardown of the preloaded modules (seconds under gVisor),
/// not what a program can see of its end: threads joined, atexit, finalizers, unclosed files.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_program_ends_as_python3_ends() {
    let gw = with_pool(&[("python", 1)], &["numpy", "pandas", "matplotlib"]).await;
    let key = gw.key("agent", "acme").await;
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let code = r#"
import atexit, threading, time
unclosed = open("/output/unclosed.txt", "w")
unclosed.write("written at exit")
atexit.register(lambda: print("atexit ran"))
def late():
    time.sleep(0.3)
    print("thread joined")
threading.Thread(target=late).start()
class Finalized:
    def __del__(self):
        print("finalizer ran")
kept = Finalized()
print("main done")
"#;
    let (status, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(
        record["stdout"], "main done\nthread joined\natexit ran\nfinalizer ran\n",
        "python3's order: threads, atexit, then the module's teardown"
    );
    assert_eq!(record["outputs"][0]["path"], "unclosed.txt", "{record}");
    assert_eq!(record["outputs"][0]["bytes"], 15, "{record}");

    // A daemon thread still running at the end dies with the program, quietly.
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let code = "import threading, time\nx = 1\ndef spin():\n    while True:\n        x\n        time.sleep(0.01)\nthreading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.1)\nraise SystemExit('bye')\n";
    let (_, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["exit_code"], 1, "{record}");
    assert_eq!(record["stderr"], "bye\n", "{record}");

    // With a daemon thread alive, an open gzip file is still completed by its finalizer, and
    // a program that closed its stdout still exits 0.
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let code = "import gzip, sys, threading, time\nthreading.Thread(target=lambda: time.sleep(100), daemon=True).start()\npacked = gzip.open('/output/x.gz', 'wt')\npacked.write('data' * 1000)\nprint('bye')\nsys.stdout.close()\n";
    let (_, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(record["exit_code"], 0, "{record}");
    assert_eq!(record["stdout"], "bye\n", "{record}");
    assert_eq!(record["outputs"][0]["path"], "x.gz", "{record}");
    // A gzip file without its end is its 10-byte header and nothing more.
    assert!(
        record["outputs"][0]["bytes"].as_u64().unwrap() > 18,
        "{record}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_preload_makes_pandas_and_matplotlib_already_imported() {
    let gw = with_pool(&[("python", 1)], &["numpy", "pandas", "matplotlib"]).await;
    let key = gw.key("agent", "acme").await;
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let code = "import sys\nprint(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules))\n";
    let (status, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["start"], "warm", "{record}");
    assert_eq!(
        record["stdout"], "['matplotlib.pyplot', 'numpy', 'pandas']\n",
        "{record}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_sandbox_reaches_nothing_and_serves_one_execution() {
    let gw = with_pool(&[("bash", 1)], &[]).await;
    let key = gw.key("agent", "acme").await;
    common::warm::wait_for_waiting(&gw.http, &gw.url, "bash").await;
    // Unclaimed: its socket directory exists (mounted) and is empty: no grant is served.
    let egress = gw.data_dir.path().join("egress");
    let dirs: Vec<_> = std::fs::read_dir(&egress).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].file_name().to_string_lossy().starts_with("sb_"));
    assert_eq!(
        std::fs::read_dir(dirs[0].path()).unwrap().count(),
        0,
        "a socket before any claim"
    );
    let first_container = pooled(&gw, "bash").await;
    let (_, first) = gw
        .execute(&key, "bash", "echo state > /tmp/left; echo one", json!({}))
        .await;
    assert_eq!(first["start"], "warm", "{first}");
    assert!(
        common::removed_soon(first["id"].as_str().unwrap()),
        "removed after one execution"
    );
    common::warm::wait_for_waiting(&gw.http, &gw.url, "bash").await;
    assert_ne!(
        pooled(&gw, "bash").await,
        first_container,
        "a new sandbox, not the used one"
    );
    let (_, second) = gw
        .execute(&key, "bash", "cat /tmp/left 2>&1 || echo clean", json!({}))
        .await;
    assert_eq!(second["start"], "warm", "{second}");
    assert!(
        second["stdout"].as_str().unwrap().ends_with("clean\n"),
        "{second}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_sandbox_killed_while_waiting_is_never_handed_out() {
    let gw = with_pool(&[("bash", 1)], &[]).await;
    let key = gw.key("agent", "acme").await;
    common::warm::wait_for_waiting(&gw.http, &gw.url, "bash").await;
    let victims = pooled(&gw, "bash").await;
    assert_eq!(victims.len(), 1);
    let killed = Command::new("docker")
        .args(["kill", &victims[0]])
        .status()
        .unwrap();
    assert!(killed.success());
    let (status, record) = gw.execute(&key, "bash", "echo fine", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["stdout"], "fine\n", "{record}");
    let long_id = Command::new("docker")
        .args(["inspect", "-f", "{{.Name}}", &victims[0]])
        .output()
        .unwrap();
    let victim_name = String::from_utf8_lossy(&long_id.stdout)
        .trim()
        .trim_start_matches('/')
        .to_owned();
    assert_ne!(
        record["container"],
        victim_name.as_str(),
        "the dead sandbox was handed out"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_that_cannot_start_is_not_ready_and_executions_still_run_cold() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| {
        config
            .images
            .insert("ruby".into(), "sandgate/no-such-image".into());
        config.warm_pool = BTreeMap::from([("ruby".to_owned(), 1)]);
    })
    .await;
    let key = gw.key("agent", "acme").await;
    let mut seen = Value::Null;
    for _ in 0..300 {
        seen = ready(&gw).await;
        if seen["checks"]["warm_pool"]["ok"] == json!(false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen["checks"]["warm_pool"]["ok"], json!(false), "{seen}");
    let detail = seen["checks"]["warm_pool"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("no-such-image"),
        "the cause is named: {detail}"
    );
    let (status, record) = gw.execute(&key, "bash", "echo cold", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["start"], "cold", "{record}");
    gw.stop().await;
}
