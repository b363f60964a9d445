//! The four situations of DESIGN section 1, end to end through the HTTP API on real dockerd,
//! runsc and PostgreSQL: files in, outputs out, datasets, limits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use common::TestGateway;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn output<'a>(record: &'a Value, path: &str) -> &'a Value {
    record["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .find(|o| o["path"] == path)
        .unwrap_or_else(|| panic!("no output {path} in {record}"))
}

/// 1. A data-analysis assistant uploads a CSV, pandas cleans it, matplotlib plots the trend,
///    the PNG comes back; the sandbox is gone afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn csv_to_pandas_to_png_download() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let mut csv = String::from("month,region,amount\n");
    for month in 1..=12 {
        csv.push_str(&format!("2026-{month:02}-01,north,{}\n", 100 + month * 7));
        csv.push_str(&format!("2026-{month:02}-01,south,\n")); // missing: cleaned away
    }
    let code = r#"
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("data/sales.csv", parse_dates=["month"]).dropna()
trend = df.groupby("month")["amount"].sum()
trend.plot(title="Monthly sales")
plt.savefig("/output/trend.png")
df.to_csv("/output/clean.csv", index=False)
print(len(df), int(trend.sum()))
"#;
    let (status, record) = gw
        .execute(
            &key,
            "python",
            code,
            json!({"files": [{"path": "data/sales.csv", "content_b64": b64(csv.as_bytes())}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    let total: i64 = (1..=12).map(|m| 100 + m * 7).sum();
    assert_eq!(record["stdout"], format!("12 {total}\n"), "{record}");
    assert_eq!(record["outputs_truncated"], false);
    let id = record["id"].as_str().unwrap();

    let png = output(&record, "trend.png");
    let (status, bytes, sha) = gw.download(&key, id, "trend.png").await;
    assert_eq!(status, 200);
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &bytes[..8.min(bytes.len())]
    );
    assert_eq!(png["bytes"], bytes.len());
    let digest = hex::encode(Sha256::digest(&bytes));
    assert_eq!(png["sha256"], digest);
    assert_eq!(sha.as_deref(), Some(digest.as_str()));

    let (status, clean, _) = gw.download(&key, id, "clean.csv").await;
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8(clean).unwrap().lines().count(), 13);

    // Gone afterwards: no container, no /output mount left on the host.
    assert!(common::removed_soon(id));
    let scratch = gw.data_dir.path().join("scratch").join(id);
    assert!(!scratch.exists(), "{} left behind", scratch.display());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(id), "a mount of {id} is left");

    // Paths that are not in the manifest are not served, whatever they look like.
    for bad in [
        "nope.png",
        "../instance",
        "..%2finstance",
        "%2e%2e/%2e%2e/etc/passwd",
    ] {
        let (status, _, _) = gw.download(&key, id, bad).await;
        assert_eq!(status, 404, "{bad}");
    }
    // Another tenant cannot download it.
    let other = gw.key("agent", "forge").await;
    let (status, _, _) = gw.download(&other, id, "trend.png").await;
    assert_eq!(status, 404);
    gw.stop().await;
}

/// 2. A coding agent runs a repository's test suite with no network; a malicious `conftest.py`
///    tries to connect out and to read secrets from `/proc/1/environ`: the tests run, the
///    attempts fail and find nothing.
#[tokio::test(flavor = "multi_thread")]
async fn test_suite_runs_and_malicious_conftest_finds_nothing() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "forge").await;
    let conftest = r#"
import json, os, socket
found = {}
for host, port in [("127.0.0.1", 8080), ("172.17.0.1", 5432)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        found[f"{host}:{port}"] = "connected"
    except OSError as err:
        found[f"{host}:{port}"] = type(err).__name__
try:
    socket.getaddrinfo("pypi.org", 443)
    found["dns"] = "resolved"
except OSError as err:
    found["dns"] = type(err).__name__
environ = {}
for pid in ["1", "self"] + [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
        environ[pid] = [item.decode(errors="replace") for item in raw.split(b"\0") if item]
    except OSError as err:
        environ[pid] = type(err).__name__
found["environ"] = environ
found["os.environ"] = dict(os.environ)
with open("/output/findings.json", "w") as out:
    json.dump(found, out)
"#;
    let files = [
        ("repo/calc.py", "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n"),
        (
            "repo/tests/test_calc.py",
            "from calc import add, mul\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\
             def test_mul():\n    assert mul(4, 5) == 20\n\ndef test_identity():\n    assert add(0, 7) == 7\n",
        ),
        ("repo/conftest.py", conftest),
    ];
    let files: Vec<Value> = files
        .iter()
        .map(|(path, text)| json!({"path": path, "content_b64": b64(text.as_bytes())}))
        .collect();
    let code = "import os, sys, pytest\nos.chdir('repo')\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider']))\n";
    let (status, record) = gw
        .execute(&key, "python", code, json!({"files": files}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert!(
        record["stdout"].as_str().unwrap().contains("3 passed"),
        "{record}"
    );
    let id = record["id"].as_str().unwrap();
    let (status, findings, _) = gw.download(&key, id, "findings.json").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(findings).unwrap();
    let findings: Value = serde_json::from_str(&text).unwrap();
    for target in ["127.0.0.1:8080", "172.17.0.1:5432"] {
        assert_ne!(findings[target], "connected", "{text}");
        assert!(findings[target].is_string(), "{text}");
    }
    assert_ne!(findings["dns"], "resolved", "{text}");
    // Nothing secret anywhere: not the caller's key, not the gateway's database URL, and no
    // variable but sandgate's own.
    assert!(!text.contains(&key), "the API key leaked");
    assert!(
        !text.contains("postgres"),
        "database details leaked: {text}"
    );
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "MPLBACKEND",
        "PYTHONUSERBASE",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "HOSTNAME",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
        "PYTEST_VERSION",
        "PYTEST_CURRENT_TEST",
        // Every sandbox has the proxy (issue 21 item 11); without a grant it refuses all.
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ];
    let names = findings["os.environ"].as_object().unwrap().keys();
    for name in names {
        assert!(
            allowed.contains(&name.as_str()),
            "unexpected variable {name}: {text}"
        );
    }
    for (pid, environ) in findings["environ"].as_object().unwrap() {
        for item in environ.as_array().into_iter().flatten() {
            let name = item.as_str().unwrap().split('=').next().unwrap();
            assert!(
                allowed.contains(&name),
                "/proc/{pid}/environ has {name}: {text}"
            );
        }
    }
    gw.stop().await;
}

/// 3. An education platform: an infinite loop and a 2 GiB allocation end as `timeout` and `oom`
///    while a normal execution next to them succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn loop_and_memory_bomb_end_while_a_neighbour_succeeds() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "classroom").await;
    let (looping, bomb, normal) = tokio::join!(
        gw.execute(&key, "python", "while True:\n    pass\n", json!({})),
        gw.execute(
            &key,
            "python",
            "x = b'\\x01' * (2 << 30)\nprint(len(x))\n",
            json!({})
        ),
        gw.execute(
            &key,
            "python",
            "import time\ntime.sleep(1)\nprint(sum(range(10)))\n",
            json!({})
        ),
    );
    assert_eq!(looping.0, 200, "{}", looping.1);
    assert_eq!(looping.1["status"], "timeout", "{}", looping.1);
    // The classroom tenant's limit (5 s) decided it, not the gateway's ceiling.
    assert_eq!(looping.1["limits"]["timeout_ms"], 5000);
    assert_eq!(bomb.0, 200, "{}", bomb.1);
    assert_eq!(bomb.1["status"], "oom", "{}", bomb.1);
    assert_eq!(normal.0, 200, "{}", normal.1);
    assert_eq!(normal.1["status"], "succeeded", "{}", normal.1);
    assert_eq!(normal.1["stdout"], "45\n");
    for record in [&looping.1, &bomb.1, &normal.1] {
        assert!(common::removed_soon(record["id"].as_str().unwrap()));
    }
    gw.stop().await;
}

fn sha256_of_tree(dir: &Path) -> String {
    let mut paths: Vec<_> = walk(dir);
    paths.sort();
    let mut hash = Sha256::new();
    for path in paths {
        hash.update(path.to_string_lossy().as_bytes());
        hash.update(std::fs::read(&path).unwrap());
    }
    hex::encode(hash.finalize())
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// 4. A research team: a read-only dataset is read, writing to it fails, results land in
///    `/output`, and the host copy's checksum is unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn dataset_is_read_only_and_results_land_in_output() {
    let dataset = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dataset.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut rows = String::from("state,population\n");
    for (i, state) in ["ohio", "utah", "iowa", "maine"].iter().enumerate() {
        rows.push_str(&format!("{state},{}\n", (i + 1) * 1000));
    }
    std::fs::create_dir(dataset.path().join("2020")).unwrap();
    std::fs::write(dataset.path().join("2020/states.csv"), &rows).unwrap();
    let before = sha256_of_tree(dataset.path());

    let gw = TestGateway::start_with_census(dataset.path()).await;
    let key = gw.key("agent", "research").await;
    let code = r#"
import csv, json, os, shutil
rows = list(csv.DictReader(open("/data/census/2020/states.csv")))
total = sum(int(r["population"]) for r in rows)
attempts = {}
for name, action in [
    ("append", lambda: open("/data/census/2020/states.csv", "a").write("evil,1\n")),
    ("create", lambda: open("/data/census/new.csv", "w").write("x")),
    ("remove", lambda: os.remove("/data/census/2020/states.csv")),
    ("rename", lambda: os.rename("/data/census/2020", "/data/census/2021")),
    ("chmod", lambda: os.chmod("/data/census/2020/states.csv", 0o777)),
    ("rmtree", lambda: shutil.rmtree("/data/census/2020")),
]:
    try:
        action()
        attempts[name] = "succeeded"
    except OSError as err:
        attempts[name] = type(err).__name__
os.makedirs("/output/summary", exist_ok=True)
json.dump({"total": total, "states": len(rows)}, open("/output/summary/result.json", "w"))
print(json.dumps(attempts))
"#;
    let (status, record) = gw
        .execute(&key, "python", code, json!({"mounts": ["dataset:census"]}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    let attempts: Value = serde_json::from_str(record["stdout"].as_str().unwrap()).unwrap();
    for (name, outcome) in attempts.as_object().unwrap() {
        assert_ne!(outcome, "succeeded", "{name} on the dataset succeeded");
    }
    let id = record["id"].as_str().unwrap();
    output(&record, "summary/result.json");
    let (status, bytes, _) = gw.download(&key, id, "summary/result.json").await;
    assert_eq!(status, 200);
    let result: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(result, json!({"total": 10000, "states": 4}));
    assert_eq!(
        sha256_of_tree(dataset.path()),
        before,
        "the host dataset changed"
    );
    gw.stop().await;
}
