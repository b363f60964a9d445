//! Inspected egress and credentials end to end (DESIGN section 11, issue 12): the HTTP API, a
//! real runsc sandbox, the real proxy terminating TLS with the execution's own CA, a real TLS
//! upstream in the test network namespace (scripts/netns.sh, 198.51.100.2) whose certificate
//! comes from a test CA given as `egress_ca_file`, and a real Postgres. Nothing leaves the
//! machine.

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use common::upstream::{echo_upstream, make_certificates, ScriptedUpstream, SECURE_HOST, UPSTREAM};
use common::{copy_of_shipped, fresh_database, TestGateway};

/// The credential's name in config and grant.
const CREDENTIAL: &str = "testcred";
/// The name the plain HTTP echo upstream is reached by (another granted host).
const ECHO_HOST: &str = "echo.test";
/// Every test secret has this shape, so the sandbox can search for any leaked one without being
/// told the value (`sgsecret-` and 32 hex digits).
const SECRET_PREFIX: &str = "sgsecret-";

/// A keep-alive HTTPS server in the namespace on 198.51.100.2:443: for every request it logs
/// `request <METHOD> <PATH> auth=<Authorization or ->` to events.log and answers
/// `ok <METHOD> <PATH>` (never echoing a header).
const HTTPS_PY: &str = r#"
import os, ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
address, root = sys.argv[1], sys.argv[2]
lock = threading.Lock()
def log(line):
    with lock, open(os.path.join(root, "events.log"), "a") as f:
        f.write(line + "\n")
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.upgrade()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        log("request %s %s auth=%s" % (self.command, self.path, self.headers.get("Authorization", "-")))
        body = ("ok %s %s\n" % (self.command, self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def upgrade(self):
        log("upgrade %s %s auth=%s" % (self.command, self.path, self.headers.get("Authorization", "-")))
        self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True
        while True:
            data = self.connection.recv(4096)
            if not data:
                return
            self.connection.sendall(b"echo:" + data)
    do_GET = do_DELETE = do_POST = answer
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer((address, 443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(os.path.join(root, "server.pem"), os.path.join(root, "server.key"))
server.socket = context.wrap_socket(server.socket, server_side=True)
open(os.path.join(root, "ready"), "w").close()
server.serve_forever()
"#;

/// The shipped bundle plus tenant `inspecttest`: `secure.test:443` inspected, with `testcred`
/// attached to `GET /repos/...`, `GET /public/...` allowed without it, nothing else; and the
/// echo upstream as a plain granted host.
fn bundle(echo_port: u16) -> tempfile::TempDir {
    let dir = copy_of_shipped();
    let tenants = dir.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let mut tenant = data["tenants"]["acme"].clone();
    let allow = json!([
        {"host": SECURE_HOST, "ports": [443], "inspect": true, "credentials": [CREDENTIAL],
         "requests": [
            // `upgrades`: the WebSocket test's upgrade must be allowed explicitly (issue 21 item 7).
            {"methods": ["GET"], "paths": ["/repos/"], "credentials": [CREDENTIAL],
             "upgrades": ["websocket"]},
            {"methods": ["GET"], "paths": ["/public/"]},
         ]},
        {"host": ECHO_HOST, "ports": [echo_port]},
    ]);
    tenant["network"]["allow"] = serde_yaml_ng::to_value(allow).unwrap();
    tenant["network"]["review_unlisted_hosts"] = serde_yaml_ng::Value::Bool(false);
    data["tenants"]["inspecttest"] = tenant;
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    dir
}

/// A gateway with the credential (from a file) and, when given, the test CA as `egress_ca_file`.
async fn gateway(policies: &Path, secret_file: &Path, ca_file: Option<PathBuf>) -> TestGateway {
    let url = fresh_database().await;
    let policies = policies.to_owned();
    let secret_file = secret_file.to_owned();
    TestGateway::start_with(Some(url), move |config| {
        config.policy_dir = policies;
        config.egress_ca_file = ca_file;
        for host in [SECURE_HOST, ECHO_HOST] {
            config
                .egress_hosts
                .insert(host.to_owned(), vec![UPSTREAM.parse().unwrap()]);
        }
        config.credentials.insert(
            CREDENTIAL.to_owned(),
            gateway::config::CredentialConfig {
                value_env: None,
                value_file: Some(secret_file),
                header: "authorization".to_owned(),
                format: "Bearer {value}".to_owned(),
            },
        );
    })
    .await
}

fn new_secret(dir: &Path) -> (String, PathBuf) {
    let secret = format!("{SECRET_PREFIX}{}", uuid::Uuid::new_v4().simple());
    let path = dir.join("secret");
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    (secret, path)
}

/// method, path, host, allow, reason, credentials, status_code of an `egress_requests` row.
type RequestRow = (
    String,
    String,
    String,
    bool,
    String,
    Vec<String>,
    Option<i32>,
);

/// Python for the sandbox: `req(method, url, headers)` through the proxy (urllib honours
/// HTTPS_PROXY and, for verification, SSL_CERT_FILE via the default context), and `leaks()`,
/// which searches env, every process's environ and cmdline and every readable file for any
/// `sgsecret-<32 hex>`; `DECOY` is one it plants itself, so a working search finds exactly it.
const SANDBOX_PY: &str = r#"
import glob, http.client, json, os, re, ssl, urllib.request, urllib.error
PATTERN = re.compile(rb"sgsecret-[0-9a-f]{32}")
DECOY = "sgsecret-" + "d" * 32
def req(method, url, headers=None):
    r = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(r, timeout=20) as resp:
            return [resp.status, resp.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
def leaks():
    with open("/tmp/decoy.txt", "w") as f:
        f.write(DECOY)
    found = set()
    for m in PATTERN.findall("\n".join("%s=%s" % kv for kv in os.environ.items()).encode()):
        found.add(m.decode())
    paths = glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline")
    for root in ["/workspace", "/tmp", "/output", "/run", "/etc", "/home", "/root", "/sandgate"]:
        for d, _, files in os.walk(root):
            paths += [os.path.join(d, f) for f in files]
    for p in paths:
        try:
            with open(p, "rb") as f:
                for m in PATTERN.findall(f.read(8 << 20)):
                    found.add(m.decode())
        except OSError:
            pass
    return sorted(found)
"#;

/// GET allowed and DELETE refused on one host; the credential arrives upstream in its header and
/// nowhere in the sandbox; a placeholder sent where it is not granted (another host, or a request
/// of the same host the policy did not give the credential) is denied `credential.misdirected`;
/// a second request on one keep-alive connection is decided on its own; every request has one
/// row and one audit event, and no row holds the value.
#[tokio::test(flavor = "multi_thread")]
async fn inspected_requests_are_decided_one_by_one_and_the_credential_never_enters_the_sandbox() {
    let https = ScriptedUpstream::start(HTTPS_PY).await;
    let echo = echo_upstream();
    let policies = bundle(echo.port);
    let secrets = tempfile::tempdir().unwrap();
    let (secret, secret_file) = new_secret(secrets.path());
    let gw = gateway(policies.path(), &secret_file, Some(https.ca_file())).await;
    let key = gw.key("agent", "inspecttest").await;
    let code = format!(
        r#"{SANDBOX_PY}
ph = os.environ["SANDGATE_CREDENTIAL_TESTCRED"]
out = {{"placeholder": ph, "ssl_cert_file": os.environ.get("SSL_CERT_FILE"),
       "requests_ca_bundle": os.environ.get("REQUESTS_CA_BUNDLE")}}
out["get"] = req("GET", "https://{SECURE_HOST}/repos/acme/app", {{"Authorization": "token " + ph}})
out["delete"] = req("DELETE", "https://{SECURE_HOST}/repos/acme/app")
out["admin"] = req("GET", "https://{SECURE_HOST}/admin/keys")
out["public_placeholder"] = req("GET", "https://{SECURE_HOST}/public/x?token=" + ph)
out["other_host"] = req("GET", "http://{ECHO_HOST}:{port}/?token=" + ph)
c = http.client.HTTPSConnection("127.0.0.1", 3128, timeout=20, context=ssl.create_default_context())
c.set_tunnel("{SECURE_HOST}", 443)
c.request("GET", "/repos/one")
r1 = c.getresponse(); b1 = r1.read().decode()
c.request("DELETE", "/repos/one")
r2 = c.getresponse(); b2 = r2.read().decode()
c.request("GET", "/repos/two")
r3 = c.getresponse(); b3 = r3.read().decode()
out["keepalive"] = [[r1.status, b1], [r2.status, b2], [r3.status, b3]]
out["leaks"] = leaks()
import subprocess
pip = subprocess.run(["python3", "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                      "--disable-pip-version-check", "--retries", "0", "-d", "/tmp/dl",
                      "--index-url", "https://{SECURE_HOST}/repos/simple/", "sgdemo"],
                     capture_output=True, text=True, timeout=60)
out["pip"] = pip.stdout + pip.stderr
print(json.dumps(out))
"#,
        port = echo.port
    );
    let extra = json!({"network": [
        {"host": SECURE_HOST, "port": 443}, {"host": ECHO_HOST, "port": echo.port},
    ]});
    let (status, body) = gw.execute(&key, "python", &code, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    let out: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let id = body["id"].as_str().unwrap().to_owned();

    let placeholder = out["placeholder"].as_str().unwrap().to_owned();
    assert!(placeholder.starts_with("sgph_"), "{out:#}");
    assert_eq!(
        out["ssl_cert_file"], "/tmp/sandgate/ca-bundle.pem",
        "{out:#}"
    );
    assert_eq!(
        out["requests_ca_bundle"], "/tmp/sandgate/ca-bundle.pem",
        "{out:#}"
    );
    assert_eq!(
        out["get"],
        json!([200, "ok GET /repos/acme/app\n"]),
        "{out:#}"
    );
    let refused = |case: &str, code: &str| {
        let answer = &out[case];
        assert_eq!(answer[0], 403, "{case}: {out:#}");
        let text = answer[1].as_str().unwrap();
        assert!(
            text.starts_with(&format!("sandgate-egress: {code}: ")),
            "{case}: {out:#}"
        );
    };
    refused("delete", "egress.method_not_allowed");
    refused("admin", "egress.path_not_allowed");
    refused("public_placeholder", "credential.misdirected");
    refused("other_host", "credential.misdirected");
    let keepalive = &out["keepalive"];
    assert_eq!(keepalive[0], json!([200, "ok GET /repos/one\n"]), "{out:#}");
    assert_eq!(keepalive[1][0], 403, "{out:#}");
    assert_eq!(keepalive[2], json!([200, "ok GET /repos/two\n"]), "{out:#}");
    // The search works (it finds the decoy) and finds nothing else: no value in the sandbox.
    assert_eq!(
        out["leaks"],
        json!([format!("{SECRET_PREFIX}{}", "d".repeat(32))]),
        "{out:#}"
    );

    // Upstream: only the allowed requests arrived, each with the credential in its header (the
    // sandbox's own Authorization, a placeholder, replaced).
    let bearer = format!("auth=Bearer {secret}");
    // pip trusts the execution's CA through PIP_CERT: its index request arrived, credential and
    // all (the "index" has no links, so pip then finds no distribution, which is fine here).
    let (pip, seen): (Vec<String>, Vec<String>) = https
        .events()
        .into_iter()
        .partition(|line| line.contains(" /repos/simple/"));
    assert!(
        pip.contains(&format!("request GET /repos/simple/sgdemo/ {bearer}")),
        "pip: {pip:?}; its output: {}",
        out["pip"]
    );
    assert_eq!(
        seen,
        vec![
            format!("request GET /repos/acme/app {bearer}"),
            format!("request GET /repos/one {bearer}"),
            format!("request GET /repos/two {bearer}"),
        ],
        "the upstream saw: {seen:#?}"
    );
    assert!(echo.accepted().is_empty(), "{:?}", echo.accepted());

    // Rows: one per request, one audit event each; the value nowhere in the database's rows.
    let pool = gw.pool().await;
    let rows: Vec<RequestRow> = sqlx::query_as(
        "SELECT method, path, host, allow, reason, credentials, status_code \
             FROM egress_requests WHERE execution_id = $1 ORDER BY started_at, id",
    )
    .bind(&id)
    .fetch_all(&pool)
    .await
    .unwrap();
    let summary: Vec<String> = rows
        .iter()
        .filter(|(_, path, ..)| !path.starts_with("/repos/simple/"))
        .map(|(m, p, _, allow, reason, creds, status)| {
            format!("{m} {p} {allow} {reason} {creds:?} {status:?}")
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            "GET /repos/acme/app true egress.allowed [\"testcred\"] Some(200)",
            "DELETE /repos/acme/app false egress.method_not_allowed [] Some(403)",
            "GET /admin/keys false egress.path_not_allowed [] Some(403)",
            "GET /public/x false credential.misdirected [\"testcred\"] Some(403)",
            "GET /repos/one true egress.allowed [\"testcred\"] Some(200)",
            "DELETE /repos/one false egress.method_not_allowed [] Some(403)",
            "GET /repos/two true egress.allowed [\"testcred\"] Some(200)",
        ],
        "{summary:#?}"
    );
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'egress.request' AND execution_id = $1",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(events, rows.len() as i64, "one audit event per request row");
    let misdirected: String = sqlx::query_scalar(
        "SELECT reason FROM egress_connections WHERE execution_id = $1 AND host = $2",
    )
    .bind(&id)
    .bind(ECHO_HOST)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(misdirected, "credential.misdirected");
    // Every table of the database, whole rows as text (what a `pg_dump` of the data holds).
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(tables.contains(&"egress_requests".to_owned()), "{tables:?}");
    for table in tables {
        let hits: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{table}\" AS t WHERE t::text LIKE '%' || $1 || '%'"
        ))
        .bind(&secret)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(hits, 0, "the credential's value is in {table}");
    }
    pool.close().await;
    assert!(!body.to_string().contains(&secret), "{body}");
    gw.stop().await;
}

/// The upstream's certificate is verified: without the test CA as `egress_ca_file` the same
/// upstream does not verify, the request fails closed (502 `egress.upstream_tls_failed`), nothing
/// reaches it, and that is recorded. A client that does not trust the execution's CA (as a
/// pinning client does not) fails its handshake, and that is recorded too.
#[tokio::test(flavor = "multi_thread")]
async fn an_unverified_upstream_and_a_pinning_client_both_fail_closed_and_are_recorded() {
    let https = ScriptedUpstream::start(HTTPS_PY).await;
    let echo = echo_upstream();
    let policies = bundle(echo.port);
    let secrets = tempfile::tempdir().unwrap();
    let (_secret, secret_file) = new_secret(secrets.path());
    let gw = gateway(policies.path(), &secret_file, None).await;
    let key = gw.key("agent", "inspecttest").await;
    let code = format!(
        r#"{SANDBOX_PY}
out = {{"get": req("GET", "https://{SECURE_HOST}/repos/acme/app")}}
pinned = ssl.create_default_context(cafile="/workspace/other-ca.pem")
try:
    urllib.request.urlopen("https://{SECURE_HOST}/repos/acme/app", context=pinned, timeout=20)
    out["pinned"] = "ok"
except Exception as e:
    out["pinned"] = repr(e)
print(json.dumps(out))
"#
    );
    // The "pinned" trust: a CA that signed nothing the proxy presents.
    let other = tempfile::tempdir().unwrap();
    make_certificates(other.path());
    let other_ca = std::fs::read(other.path().join("ca.pem")).unwrap();
    use base64::Engine as _;
    let extra = json!({
        "network": [{"host": SECURE_HOST, "port": 443}],
        "files": [{"path": "other-ca.pem",
                   "content_b64": base64::engine::general_purpose::STANDARD.encode(other_ca)}],
    });
    let (status, body) = gw.execute(&key, "python", &code, extra).await;
    assert_eq!(status, 200, "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    let out: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(out["get"][0], 502, "{out:#}");
    assert!(
        out["get"][1]
            .as_str()
            .unwrap()
            .starts_with("sandgate-egress: egress.upstream_tls_failed: "),
        "{out:#}"
    );
    assert!(
        out["pinned"]
            .as_str()
            .unwrap()
            .contains("CERTIFICATE_VERIFY_FAILED"),
        "{out:#}"
    );
    assert!(https.events().is_empty(), "{:?}", https.events());

    let id = body["id"].as_str().unwrap();
    let pool = gw.pool().await;
    let closes: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT close_reason FROM egress_connections WHERE execution_id = $1 ORDER BY opened_at",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        closes,
        vec![
            Some("egress.completed".to_owned()),
            Some("egress.client_tls_failed".to_owned())
        ],
        "first tunnel served (its request failed upstream), second refused by the client"
    );
    let failed: Vec<(String, Option<i32>, Option<String>)> = sqlx::query_as(
        "SELECT reason, status_code, error FROM egress_requests WHERE execution_id = $1",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].1, Some(502), "{failed:?}");
    assert!(
        failed[0].2.as_deref().unwrap_or("").contains("TLS"),
        "{failed:?}"
    );
    pool.close().await;
    gw.stop().await;
}

/// WebSocket upgrades are requests like any other: one on a denied path gets the proxy's 403 and
/// never reaches the upstream (nor does one naming another host than the tunnel's: 400
/// `egress.host_mismatch`); one on an allowed path carries the credential, gets the
/// upstream's `101`, and the two sides are then relayed as they are. Both have a request row.
#[tokio::test(flavor = "multi_thread")]
async fn websocket_upgrades_are_decided_as_requests_and_relayed_once_allowed() {
    let https = ScriptedUpstream::start(HTTPS_PY).await;
    let echo = echo_upstream();
    let policies = bundle(echo.port);
    let secrets = tempfile::tempdir().unwrap();
    let (secret, secret_file) = new_secret(secrets.path());
    let gw = gateway(policies.path(), &secret_file, Some(https.ca_file())).await;
    let key = gw.key("agent", "inspecttest").await;
    let code = format!(
        r#"
import json, socket, ssl
def ws(path, host="{SECURE_HOST}"):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=15)
    s.sendall(b"CONNECT {SECURE_HOST}:443 HTTP/1.1\r\nHost: {SECURE_HOST}:443\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    t = ssl.create_default_context().wrap_socket(s, server_hostname="{SECURE_HOST}")
    t.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n" % (path, host)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += t.recv(1)
    status = head.split(b"\r\n")[0].decode()
    if " 101 " not in status:
        return [status, ""]
    t.sendall(b"ping")
    return [status, t.recv(100).decode()]
print(json.dumps({{"allowed": ws("/repos/ws"), "denied": ws("/ws"),
                  "other_host": ws("/repos/ws", "evil.test")}}))
"#
    );
    let extra = json!({"network": [{"host": SECURE_HOST, "port": 443}]});
    let (status, body) = gw.execute(&key, "python", &code, extra).await;
    assert_eq!(status, 200, "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    let out: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        out["allowed"],
        json!(["HTTP/1.1 101 Switching Protocols", "echo:ping"]),
        "{out:#}"
    );
    // The proxy's refusal names its reason in the status line too.
    let status_line = |case: &str| out[case][0].as_str().unwrap().to_owned();
    assert!(
        status_line("denied")
            .starts_with("HTTP/1.1 403 sandgate-egress: egress.path_not_allowed: "),
        "{out:#}"
    );
    // A request naming another host than the tunnel's is refused too.
    assert!(
        status_line("other_host")
            .starts_with("HTTP/1.1 400 sandgate-egress: egress.host_mismatch: "),
        "{out:#}"
    );
    assert_eq!(
        https.events(),
        vec![format!("upgrade GET /repos/ws auth=Bearer {secret}")],
        "only the allowed upgrade reached the upstream"
    );
    let pool = gw.pool().await;
    let rows: Vec<(String, bool, bool, String, Option<i32>)> = sqlx::query_as(
        "SELECT path, upgrade, allow, reason, status_code FROM egress_requests \
         WHERE execution_id = $1 ORDER BY started_at",
    )
    .bind(body["id"].as_str().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                "/repos/ws".to_owned(),
                true,
                true,
                "egress.allowed".to_owned(),
                Some(101)
            ),
            (
                "/ws".to_owned(),
                true,
                false,
                "egress.path_not_allowed".to_owned(),
                Some(403)
            ),
            (
                "/repos/ws".to_owned(),
                true,
                false,
                "egress.host_mismatch".to_owned(),
                Some(400)
            ),
        ]
    );
    pool.close().await;
    gw.stop().await;
}
