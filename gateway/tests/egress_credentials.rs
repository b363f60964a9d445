//! Credential values are read again on reload (issue 12 item 4): after `POST /v1/policy/reload`
//! or SIGHUP, new executions send the rotated value; a value that cannot be read is an error
//! naming the credential (never a value) and the previous values stay. And no value is anywhere
//! in a `pg_dump` of the whole database or in the gateway's logs at debug level (item 7). Through the real stack:
//! the HTTP API, a runsc sandbox running curl, the proxy inspecting with the execution's CA, an
//! HTTPS upstream in the test network namespace that logs the Authorization it receives, and
//! Postgres. Its own test binary: it raises SIGHUP in the test process (the in-process gateway's
//! handler), which must not reach other tests' gateways.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};

use common::files_upstream::FilesUpstream;
use common::upstream::{SECURE_HOST, UPSTREAM};
use common::{copy_of_shipped, fresh_database, TestGateway};

const CREDENTIAL: &str = "testcred";

/// The plain-HTTP host of the body test.
const SINK_HOST: &str = "sink.test";

/// The shipped bundle plus tenant `credtest`: `secure.test:443` inspected, every GET carrying
/// `testcred`; `sink.test` on `sink_port` as a plain granted host.
fn bundle(sink_port: u16) -> tempfile::TempDir {
    let dir = copy_of_shipped();
    let tenants = dir.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let mut tenant = data["tenants"]["acme"].clone();
    let allow = json!([{"host": SECURE_HOST, "ports": [443], "inspect": true,
                        "credentials": [CREDENTIAL],
                        "requests": [{"methods": ["GET"], "paths": ["/"], "credentials": [CREDENTIAL]}]},
                       {"host": SINK_HOST, "ports": [sink_port]}]);
    tenant["network"]["allow"] = serde_yaml_ng::to_value(allow).unwrap();
    tenant["network"]["review_unlisted_hosts"] = serde_yaml_ng::Value::Bool(false);
    data["tenants"]["credtest"] = tenant;
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    dir
}

/// A gateway inspecting with the test CA as `egress_ca_file`, `testcred` read from `token`.
async fn gateway(policies: &Path, ca: PathBuf, token: PathBuf) -> TestGateway {
    let dir = policies.to_owned();
    TestGateway::start_with(Some(fresh_database().await), move |config| {
        config.policy_dir = dir;
        config.egress_ca_file = Some(ca);
        for host in [SECURE_HOST, SINK_HOST] {
            config
                .egress_hosts
                .insert(host.to_owned(), vec![UPSTREAM.parse().unwrap()]);
        }
        config.credentials.insert(
            CREDENTIAL.to_owned(),
            gateway::config::CredentialConfig {
                value_env: None,
                value_file: Some(token),
                header: "authorization".to_owned(),
                format: "Bearer {value}".to_owned(),
            },
        );
    })
    .await
}

fn secret(round: &str) -> String {
    format!("sgsecret-{round}-{}", uuid::Uuid::new_v4().simple())
}

/// Runs `curl https://secure.test/hello.txt` in a sandbox; returns the Authorization the upstream
/// received for it.
async fn fetch(gw: &TestGateway, key: &str, files: &FilesUpstream, path: &str) -> String {
    let code = format!("curl -sS https://{SECURE_HOST}{path}");
    let extra = json!({"network": [{"host": SECURE_HOST, "port": 443}]});
    let (status, body) = gw.execute(key, "bash", &code, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body:#}");
    let prefix = format!("GET {path} auth=");
    let seen: Vec<String> = files
        .requests()
        .into_iter()
        .filter_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
        .collect();
    assert_eq!(seen.len(), 1, "{:?}", files.requests());
    seen[0].clone()
}

async fn reload(gw: &TestGateway, admin: &str) -> Value {
    let (status, body) = gw.post(admin, "/v1/policy/reload", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn reload_events(gw: &TestGateway, by: &str) -> i64 {
    let pool = gw.pool().await;
    let count = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'policy.reload' AND key_id = $1",
    )
    .bind(by)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    count
}

/// Everything the gateway (in this process) logs, at debug level and above, from the moment the
/// test starts.
fn capture_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    let logs = LOGS.get_or_init(Arc::default).clone();
    let sink = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || LogSink(sink.clone()))
        .try_init();
    logs
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `pg_dump` of the gateway's whole database (schema and every row), as text. The test
/// database's URL is `postgres://postgres@localhost/<name>?host=<socket dir>&port=5432`.
fn pg_dump(database_url: &str) -> String {
    let rest = database_url
        .strip_prefix("postgres://postgres@localhost/")
        .unwrap();
    let (name, query) = rest.split_once('?').unwrap();
    let host = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("host="))
        .unwrap();
    let pg_dump = newest_pg_dump();
    let output = Command::new(&pg_dump)
        .args([
            "--host",
            host,
            "--port",
            "5432",
            "--username",
            "postgres",
            "--dbname",
            name,
        ])
        .output()
        .unwrap_or_else(|err| panic!("{}: {err}", pg_dump.display()));
    assert!(
        output.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn newest_pg_dump() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL under /usr/lib/postgresql (scripts/setup.sh installs it)")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let path = entry.path().join("bin/pg_dump");
            path.is_file().then_some((version, path))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("pg_dump under /usr/lib/postgresql/*/bin")
        .1
}

fn write(path: &Path, value: &str) {
    std::fs::write(path, format!("{value}\n")).unwrap();
}

/// Rotations through the API and SIGHUP, a failed one, then a search of the database and the
/// debug log for every value the test used.
#[tokio::test(flavor = "multi_thread")]
async fn credential_values_are_read_again_on_reload_and_never_reach_the_database_or_logs() {
    let logs = capture_logs();
    let files = FilesUpstream::start().await;
    let policies = bundle(9);
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    let first = secret("first");
    write(&token, &first);
    let gw = gateway(policies.path(), files.ca_file(), token.clone()).await;
    let key = gw.key("agent", "credtest").await;
    let admin = gw.key("admin", "ops").await;
    assert_eq!(
        fetch(&gw, &key, &files, "/hello.txt?1").await,
        format!("Bearer {first}")
    );

    // Rotated in the file, read again by the API's reload.
    let second = secret("second");
    write(&token, &second);
    let answer = reload(&gw, &admin).await;
    assert_eq!(answer["credentials"], json!({"reloaded": 1}), "{answer}");
    assert_eq!(
        fetch(&gw, &key, &files, "/hello.txt?2").await,
        format!("Bearer {second}")
    );

    // A reload refused by its If-Match (409) changes nothing: the rotated value is not read.
    let unread = secret("unread");
    write(&token, &unread);
    let refused = gw
        .http
        .post(format!("{}/v1/policy/reload", gw.url))
        .bearer_auth(&admin)
        .header("if-match", format!("\"sha256:{}\"", "0".repeat(64)))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 409);
    assert_eq!(
        fetch(&gw, &key, &files, "/hello.txt?2b").await,
        format!("Bearer {second}")
    );

    // Rotated again, read again on SIGHUP (the reload's audit event marks its end).
    let third = secret("third");
    write(&token, &third);
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
    for _ in 0..200 {
        if reload_events(&gw, "sighup").await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        reload_events(&gw, "sighup").await,
        1,
        "SIGHUP did not reload"
    );
    assert_eq!(
        fetch(&gw, &key, &files, "/hello.txt?3").await,
        format!("Bearer {third}")
    );

    // Gone: the error names the credential and the file, never a value; the last value stays.
    std::fs::remove_file(&token).unwrap();
    let answer = reload(&gw, &admin).await;
    let error = answer["credentials"]["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "credential {CREDENTIAL}: cannot read {}: ",
            token.display()
        )),
        "{answer}"
    );
    for value in [&first, &second, &third] {
        assert!(!answer.to_string().contains(value.as_str()), "{answer}");
    }
    assert_eq!(
        fetch(&gw, &key, &files, "/hello.txt?4").await,
        format!("Bearer {third}")
    );

    // Nowhere at rest or in the logs: a pg_dump of the whole database (its rows hold the five
    // requests, each naming the credential) and every line logged at debug level.
    let dump = pg_dump(gw.database_url.as_deref().unwrap());
    assert!(
        dump.contains("egress_requests") && dump.contains(CREDENTIAL),
        "an empty dump?"
    );
    gw.stop().await;
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains(" DEBUG ") && logs.contains("credential values read again"),
        "the debug log was not captured: {} bytes",
        logs.len()
    );
    for value in [&first, &second, &unread, &third] {
        assert!(
            !dump.contains(value.as_str()),
            "pg_dump holds a credential's value"
        );
        assert!(
            !logs.contains(value.as_str()),
            "the log holds a credential's value"
        );
    }
}

/// Records every byte it receives (`received.bin`) and answers `200` once a request's whole
/// body (Content-Length) has arrived; never before, so only the proxy can answer first.
const SINK_PY: &str = r#"
import os, socket, sys
address, root = sys.argv[1], sys.argv[2]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((address, 0))
server.listen(8)
open(os.path.join(root, "port.tmp"), "w").write(str(server.getsockname()[1]))
os.rename(os.path.join(root, "port.tmp"), os.path.join(root, "port"))
while True:
    conn, _ = server.accept()
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        with open(os.path.join(root, "received.bin"), "ab") as f:
            f.write(chunk)
        head, sep, body = data.partition(b"\r\n\r\n")
        length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
        if sep and length and len(body) >= length[0]:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
            break
    conn.close()
"#;

/// The sink, killed on drop.
struct Sink {
    child: std::process::Child,
    root: tempfile::TempDir,
    port: u16,
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sink {
    fn start() -> Sink {
        common::egress::netns_up();
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("sink.py"), SINK_PY).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", "sgtest", "python3"])
            .arg(root.path().join("sink.py"))
            .arg(UPSTREAM)
            .arg(root.path())
            .spawn()
            .unwrap();
        let mut sink = Sink {
            child,
            root,
            port: 0,
        };
        let port_file = sink.root.path().join("port");
        for _ in 0..300 {
            if let Ok(port) = std::fs::read_to_string(&port_file) {
                sink.port = port.trim().parse().unwrap();
                return sink;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the sink in the test namespace did not start within 6 s");
    }

    fn received(&self) -> Vec<u8> {
        std::fs::read(self.root.path().join("received.bin")).unwrap_or_default()
    }
}

/// A placeholder deep in the body of a plain-HTTP request (long after the head, sent after a
/// pause, so it is not among the bytes read with the head) is found as the body passes: the
/// request ends with `credential.misdirected`, answered by the proxy, and the upstream never
/// receives the placeholder, nor any byte of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_placeholder_in_a_plain_http_body_is_refused_before_it_reaches_the_upstream() {
    let files = FilesUpstream::start().await;
    let sink = Sink::start();
    let policies = bundle(sink.port);
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    write(&token, &secret("body"));
    let gw = gateway(policies.path(), files.ca_file(), token).await;
    let key = gw.key("agent", "credtest").await;
    let code = format!(
        r#"
import json, os, socket, time
ph = os.environ["SANDGATE_CREDENTIAL_TESTCRED"].encode()
body = b"a" * 200000 + ph + b"b" * 10
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"POST http://{SINK_HOST}:{port}/upload HTTP/1.1\r\nHost: {SINK_HOST}:{port}\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body))
s.sendall(body[:150000])
time.sleep(1)
try:
    s.sendall(body[150000:])
except OSError:
    pass
answer = b""
while True:
    try:
        chunk = s.recv(4096)
    except OSError:
        break
    if not chunk:
        break
    answer += chunk
print(json.dumps({{"status": answer.split(b"\r\n")[0].decode(), "placeholder": ph.decode()}}))
"#,
        port = sink.port
    );
    let extra = json!({"network": [
        {"host": SECURE_HOST, "port": 443}, {"host": SINK_HOST, "port": sink.port},
    ]});
    let (status, body) = gw.execute(&key, "python", &code, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body:#}");
    let stdout = body["stdout"].as_str().unwrap();
    let out: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert!(
        out["status"]
            .as_str()
            .unwrap()
            .starts_with("HTTP/1.1 403 sandgate-egress: credential.misdirected: "),
        "{out:#}"
    );
    let received = sink.received();
    let placeholder = out["placeholder"].as_str().unwrap();
    assert!(
        received.len() > 150_000,
        "the head and the clean part passed: {}",
        received.len()
    );
    assert!(
        !String::from_utf8_lossy(&received).contains("sgph_"),
        "the upstream received (part of) the placeholder {placeholder}"
    );
    let pool = gw.pool().await;
    let rows: Vec<(String, bool, Option<String>)> = sqlx::query_as(
        "SELECT host, allow, close_reason FROM egress_connections WHERE execution_id = $1",
    )
    .bind(body["id"].as_str().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![(
            SINK_HOST.to_owned(),
            true,
            Some("credential.misdirected".to_owned())
        )]
    );
    // And the refusal is an audit event of its own, naming the execution.
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'egress.credential.misdirected' \
         AND execution_id = $1 AND NOT allow",
    )
    .bind(body["id"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(events, 1);
    gw.stop().await;
}
