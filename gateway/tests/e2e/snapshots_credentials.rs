//! Snapshots and inspected egress (issue 24 items 1 and 4): a paused, resumed or forked
//! session's program keeps the trust bundle and the credential placeholders it was given, and
//! the restored sandbox's new listener serves them (the same CA, the same placeholders, the
//! new decision's grant), so an injected credential keeps being attached after a restore; and
//! a checkpoint image holds the placeholder but never the credential's value, the agent's API
//! key. Through the real stack: a private experimental dockerd
//! (`snapshots::shared_daemon`), runsc, the proxy terminating TLS, a TLS upstream in the test
//! namespace, PostgreSQL.

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use common::upstream::{ScriptedUpstream, SECURE_HOST, UPSTREAM};
use common::TestGateway;

use crate::snapshots::{events, gateway_with, run, shared_daemon, step};

const CREDENTIAL: &str = "snapcred";
const TENANT: &str = "snapcred";

/// An HTTPS server on 198.51.100.2:443 logging `auth=<Authorization>` per request.
const HTTPS_PY: &str = r#"
import os, ssl, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
address, root = sys.argv[1], sys.argv[2]
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        with open(os.path.join(root, "events.log"), "a") as f:
            f.write("auth=%s\n" % self.headers.get("Authorization", "-"))
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer((address, 443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(os.path.join(root, "server.pem"), os.path.join(root, "server.key"))
server.socket = context.wrap_socket(server.socket, server_side=True)
open(os.path.join(root, "ready"), "w").close()
server.serve_forever()
"#;

/// Defines `get()`: a GET through the proxy carrying the placeholder, `[status, body]` or
/// `["error", why]` (a TLS failure against a CA the program does not trust lands here).
const SETUP: &str = r#"
import os, urllib.request
ph = os.environ["SANDGATE_CREDENTIAL_SNAPCRED"]
def get():
    r = urllib.request.Request("https://secure.test/repos/x", headers={"Authorization": "token " + ph})
    try:
        with urllib.request.urlopen(r, timeout=20) as resp:
            return [resp.status, resp.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
get()"#;

const OK: &str = "[200, 'ok\\n']";

/// The shipped bundle plus tenant `snapcred`: `secure.test:443` inspected, `snapcred` attached
/// to `GET /repos/...`.
fn bundle() -> tempfile::TempDir {
    let dir = common::copy_of_shipped();
    let tenants = dir.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let mut tenant = data["tenants"]["acme"].clone();
    let allow = json!([
        {"host": SECURE_HOST, "ports": [443], "inspect": true, "credentials": [CREDENTIAL],
         "requests": [{"methods": ["GET"], "paths": ["/repos/"], "credentials": [CREDENTIAL]}]},
    ]);
    tenant["network"]["allow"] = serde_yaml_ng::to_value(allow).unwrap();
    tenant["network"]["review_unlisted_hosts"] = serde_yaml_ng::Value::Bool(false);
    data["tenants"][TENANT] = tenant;
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    dir
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// How many of `files` contain `needle`, in their bytes or in what they inflate to (runsc
/// writes the image as chunks of raw deflate, each after its big-endian length: see
/// [`inflated`]).
fn holding(files: &[(PathBuf, Vec<u8>)], needle: &str) -> usize {
    let needle = needle.as_bytes();
    let has = |bytes: &[u8]| bytes.windows(needle.len()).any(|window| window == needle);
    files
        .iter()
        .filter(|(path, inflated)| has(&std::fs::read(path).unwrap()) || has(inflated))
        .count()
}

/// Each file with the bytes its deflate chunks inflate to.
fn searchable(files: Vec<PathBuf>) -> Vec<(PathBuf, Vec<u8>)> {
    files
        .into_iter()
        .map(|path| {
            let inflated = inflated(&std::fs::read(&path).unwrap());
            (path, inflated)
        })
        .collect()
}

/// Every run of at least two `<u32 length><raw deflate>` chunks (each optionally followed by
/// a 32-byte hash) found in `file`, inflated: the format of gVisor's compressed state files,
/// read without trusting any header.
fn inflated(file: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= file.len() {
        let run = [0usize, 32]
            .into_iter()
            .find_map(|hash| chunk_run(file, at, hash));
        match run {
            Some((bytes, end)) => {
                out.extend(bytes);
                at = end;
            }
            None => at += 1,
        }
    }
    out
}

fn chunk_run(file: &[u8], mut at: usize, hash: usize) -> Option<(Vec<u8>, usize)> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut chunks = 0;
    while let Some(len) = file.get(at..at + 4) {
        let len = u32::from_be_bytes(len.try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        let Some(body) = file.get(at + 4..at + 4 + len) else {
            break;
        };
        let mut chunk = Vec::new();
        let whole = flate2::read::DeflateDecoder::new(body)
            .read_to_end(&mut chunk)
            .is_ok();
        if !whole || chunk.is_empty() {
            break;
        }
        out.extend(chunk);
        chunks += 1;
        at += 4 + len + hash;
    }
    (chunks >= 2).then_some((out, at))
}

async fn open_granted(gw: &TestGateway, key: &str, body: Value) -> String {
    let (status, session) = gw.post(key, "/v1/sessions", &body).await;
    assert_eq!(status, 201, "{session}");
    assert_eq!(session["status"], "ready", "{session}");
    session["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_injected_credential_is_attached_after_a_resume_and_in_a_fork_and_no_image_holds_it() {
    let https = ScriptedUpstream::start(HTTPS_PY).await;
    let policies = bundle();
    let secrets = tempfile::tempdir().unwrap();
    let secret = format!("sgsecret-{}", uuid::Uuid::new_v4().simple());
    let secret_file = secrets.path().join("secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let data_dir = tempfile::tempdir().unwrap();
    let ca_file = https.ca_file();
    let policy_dir = policies.path().to_owned();
    let gw = gateway_with(&daemon, url, data_dir, move |config| {
        config.policy_dir = policy_dir;
        config.egress_ca_file = Some(ca_file);
        config
            .egress_hosts
            .insert(SECURE_HOST.to_owned(), vec![UPSTREAM.parse().unwrap()]);
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
    .await;
    let agent = gw.key("agent", TENANT).await;
    let request = json!({"language": "python", "network": [{"host": SECURE_HOST, "port": 443}]});
    let id = open_granted(&gw, &agent, request.clone()).await;
    let first = run(&gw, &agent, &id, SETUP).await;
    assert_eq!(first["result"], OK, "{first}");
    let placeholder = run(&gw, &agent, &id, "ph").await["result"]
        .as_str()
        .unwrap()
        .trim_matches('\'')
        .to_owned();
    assert!(placeholder.starts_with("sgph_"), "{placeholder}");

    // Paused: the image holds the placeholder (the program's memory) but no secret.
    let (status, paused) = step(&gw, &agent, &id, "pause").await;
    assert_eq!(status, 200, "{paused}");
    let snapshots = gw.data_dir.path().join("snapshots");
    let image = searchable(files_under(&snapshots));
    assert!(!image.is_empty());
    assert!(
        holding(&image, &placeholder) > 0,
        "the search finds what the program holds"
    );
    assert_eq!(holding(&image, &secret), 0, "the credential's value");
    assert_eq!(holding(&image, &agent), 0, "the agent's API key");

    // Resumed by its next execution: the same placeholder, attached again.
    let again = run(&gw, &agent, &id, "get()").await;
    assert_eq!(again["resumed"], true, "{again}");
    assert_eq!(again["result"], OK, "{again}");

    // A kept snapshot (the session goes on through its own restore) and a fork of it.
    let (status, snapshot) = gw
        .post(&agent, &format!("/v1/sessions/{id}/snapshots"), &json!({}))
        .await;
    assert_eq!(status, 201, "{snapshot}");
    let going_on = run(&gw, &agent, &id, "get()").await;
    assert_eq!(going_on["result"], OK, "{going_on}");
    let mut fork_request = request.clone();
    fork_request["from_snapshot"] = snapshot["id"].clone();
    let fork = open_granted(&gw, &agent, fork_request).await;
    let forked = run(&gw, &agent, &fork, "(get(), ph)").await;
    assert_eq!(
        forked["result"],
        format!("({OK}, '{placeholder}')").as_str(),
        "{forked}"
    );
    let image = searchable(files_under(&snapshots));
    assert!(!image.is_empty(), "the kept snapshot's image");
    assert!(holding(&image, &placeholder) > 0);
    assert_eq!(holding(&image, &secret), 0, "the credential's value");
    assert_eq!(holding(&image, &agent), 0, "the agent's API key");

    // The upstream got the credential's value each time, never a placeholder.
    let seen = https.events();
    let wanted = format!("auth=Bearer {secret}");
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen.iter().all(|line| *line == wanted), "{seen:?}");
    assert_eq!(events(&gw, "session.resumed", &id).await.len(), 1);
    gw.stop().await;
}
