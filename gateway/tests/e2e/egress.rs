//! Egress end to end: code inside a real runsc sandbox reaches the network only through the
//! gateway's proxy (via sandbox-init's bridge and the per-execution socket), with every attempt
//! decided by policy and recorded. The upstream lives in a network namespace of this machine
//! (scripts/netns.sh), never anywhere else.

use crate::common;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::egress::{bundle_with_test_tenant, gateway_with, upstream, UPSTREAM};
use common::TestGateway;

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_reaches_only_what_the_grant_allows_and_every_attempt_is_recorded() {
    let upstream = upstream();
    let port = upstream.port;
    let policies = bundle_with_test_tenant(&[
        ("files.test", port),
        ("private.test", port),
        ("loop.test", port),
    ]);
    let gw = gateway_with(
        policies.path(),
        &[
            ("files.test", UPSTREAM),
            ("private.test", "10.0.0.5"),
            ("loop.test", "127.0.0.1"),
        ],
    )
    .await;
    let key = gw.key("agent", "nettest").await;
    let code = format!(
        r#"
import json, os, socket, time, urllib.request, urllib.error
out = {{"env_proxy": os.environ.get("HTTP_PROXY")}}
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
out["allowed"] = fetch("http://files.test:{port}/hello.txt")
out["not_granted"] = fetch("http://evil.example:{port}/")
out["metadata"] = fetch("http://169.254.169.254/latest/meta-data/")
out["metadata_decimal"] = fetch("http://2852039166/")
out["private"] = fetch("http://private.test:{port}/")
out["loopback"] = fetch("http://loop.test:{port}/")
started = time.time()
try:
    socket.create_connection(("{UPSTREAM}", {port}), timeout=5)
    out["direct"] = "connected"
except OSError as e:
    out["direct"] = type(e).__name__
out["direct_seconds"] = time.time() - started
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("{UPSTREAM}", 53))
    out["udp"] = "sent"
except OSError as e:
    out["udp"] = type(e).__name__
print(json.dumps(out))
"#
    );
    let network = json!([
        {"host": "files.test", "port": port},
        {"host": "private.test", "port": port},
        {"host": "loop.test", "port": port},
    ]);
    let (status, body) = gw
        .execute(&key, "python", &code, json!({"network": network}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let out: Value = serde_json::from_str(body["stdout"].as_str().unwrap())
        .unwrap_or_else(|err| panic!("{err}: {body}"));
    assert_eq!(out["env_proxy"], "http://127.0.0.1:3128");
    assert_eq!(
        out["allowed"],
        json!([200, "hello through the proxy\n"]),
        "{out}"
    );
    for (case, code) in [
        ("not_granted", "egress.host_not_granted"),
        ("metadata", ""),
        ("metadata_decimal", ""),
        ("private", "egress.address_denied"),
        ("loopback", "egress.address_denied"),
    ] {
        let answer = &out[case];
        assert_eq!(answer[0], 403, "{case}: {out}");
        let text = answer[1].as_str().unwrap();
        assert!(text.starts_with("sandgate-egress: "), "{case}: {text}");
        assert!(text.contains(code), "{case}: {text}");
    }
    assert_ne!(out["direct"], "connected", "{out}");
    assert!(
        out["direct_seconds"].as_f64().unwrap() < 1.0,
        "direct socket did not fail fast: {out}"
    );
    assert_ne!(out["udp"], "sent", "{out}");

    // Every attempt through the proxy left exactly one row; the allowed one counted its bytes.
    let id = body["id"].as_str().unwrap();
    let (status, rows) = gw
        .get(&key, &format!("/v1/executions/{id}/connections"))
        .await;
    assert_eq!(status, 200, "{rows}");
    let rows = rows["connections"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 6, "{rows:#?}");
    let allowed: Vec<&Value> = rows.iter().filter(|r| r["allow"] == true).collect();
    assert_eq!(allowed.len(), 1, "{rows:#?}");
    assert_eq!(allowed[0]["host"], "files.test");
    assert_eq!(allowed[0]["resolved_addr"], format!("{UPSTREAM}:{port}"));
    assert!(allowed[0]["bytes_down"].as_i64().unwrap() > 20, "{rows:#?}");
    assert!(allowed[0]["bytes_up"].as_i64().unwrap() > 20, "{rows:#?}");
    assert!(allowed[0]["closed_at"].is_string(), "{rows:#?}");
    for row in rows.iter().filter(|r| r["allow"] == false) {
        assert!(
            row["reason"].as_str().unwrap().starts_with("egress."),
            "{row}"
        );
        assert!(
            row["resolved_addr"].is_null() || row["host"] != "evil.example",
            "{row}"
        );
    }
    let pool = gw.pool().await;
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'egress.connection' AND execution_id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(events, 6, "one audit event per attempt");
    gw.stop().await;
}

/// Without a grant the sandbox still has no network interface (only loopback), but it has the
/// proxy (issue 21 item 11): a request through it is refused `egress.no_grant`, naming what
/// to ask for, instead of a name that does not resolve.
#[tokio::test(flavor = "multi_thread")]
async fn executions_without_a_grant_get_the_proxy_which_refuses_with_no_grant() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let code = r#"
import os, socket, urllib.request, urllib.error
print(os.path.exists("/run/sandgate/egress.sock"), "HTTP_PROXY" in os.environ)
net = "/sys/class/net"
print([n for n in os.listdir(net) if n != "lo"] if os.path.isdir(net) else [])
try:
    urllib.request.urlopen("http://pypi.org/simple/", timeout=10)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
"#;
    let (status, body) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[..2],
        ["True True", "[]"],
        "no interface but loopback: {body}"
    );
    assert!(
        lines[2].starts_with("403 sandgate-egress: egress.no_grant: execution ex_")
            && lines[2].contains("\"network\": [{\"host\": \"pypi.org\", \"port\": 80}]"),
        "{body}"
    );
    gw.stop().await;
}

/// Connects to a Unix socket as the host user `nobody` (through `setpriv`, the system's Python)
/// and prints `connected` or the error's name.
fn connect_as_nobody(socket: &std::path::Path) -> String {
    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
        ])
        .arg(
            "import socket, sys\n\
             s = socket.socket(socket.AF_UNIX)\n\
             try:\n    s.connect(sys.argv[1]); print('connected')\n\
             except OSError as e:\n    print(type(e).__name__)",
        )
        .arg(socket)
        .output()
        .expect("setpriv and /usr/bin/python3 are needed (apt-get install util-linux python3)");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A running execution's egress socket is reachable by the sandbox (through runsc, as root on the
/// host) and by nothing else: the host user `nobody` cannot connect to it (it would use the
/// execution's grant, audited as the execution), even when the data directory is world-readable.
#[tokio::test(flavor = "multi_thread")]
async fn host_users_cannot_reach_a_running_executions_egress_socket() {
    use std::os::unix::fs::PermissionsExt;
    let upstream = upstream();
    let port = upstream.port;
    let policies = bundle_with_test_tenant(&[("files.test", port)]);
    let gw = gateway_with(policies.path(), &[("files.test", UPSTREAM)]).await;
    // An operator's data directory is often traversable by everyone (/var/lib/sandgate, 0755).
    let data = gw.data_dir.path().to_owned();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = gw.key("agent", "nettest").await;
    let code = format!(
        "import time, urllib.request\ntime.sleep(8)\n\
         print(urllib.request.urlopen('http://files.test:{port}/hello.txt', timeout=10).status)\n"
    );
    let network = json!([{"host": "files.test", "port": port}]);
    let body = json!({"language": "python", "code": code, "network": network, "wait": false});
    let (status, created) = gw.post(&key, "/v1/executions", &body).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    // The socket directory is named by the sandbox (warm or cold); this execution's is the only
    // one with a socket in it.
    let mut socket = None;
    for _ in 0..300 {
        socket = std::fs::read_dir(data.join("egress"))
            .into_iter()
            .flatten()
            .map(|entry| entry.unwrap().path().join("egress.sock"))
            .find(|path| path.exists());
        if socket.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let socket = socket.unwrap_or_else(|| panic!("no egress socket for {id}"));
    assert_eq!(connect_as_nobody(&socket), "PermissionError");
    let root_mode = std::fs::metadata(data.join("egress"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(root_mode & 0o777, 0o700, "egress root mode {root_mode:o}");
    let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(record["status"], "running", "the socket was live: {record}");

    // The sandbox itself still reaches the proxy through the same socket.
    let mut record = record;
    for _ in 0..600 {
        if record["finished_at"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        record = gw.get(&key, &format!("/v1/executions/{id}")).await.1;
    }
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["stdout"], "200\n", "{record}");
    let (_, rows) = gw
        .get(&key, &format!("/v1/executions/{id}/connections"))
        .await;
    let rows = rows["connections"].as_array().unwrap().clone();
    assert_eq!(
        rows.len(),
        1,
        "only the sandbox's own connection: {rows:#?}"
    );
    gw.stop().await;
}
