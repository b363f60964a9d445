//! The sandbox image keeps the README's promises (issue 16 item 1, issue 12 item 7): `pip
//! install x` without flags from the real PyPI, through the proxy, importable at once; bash with
//! the same toolbox (python3, pip, pytest, git, curl); `curl`, `git`, `requests`, `urllib` and
//! `pip` over HTTPS through a plain tunnel and, with no flag at all, through an inspected one.
//! Everything goes through the HTTP API, a real runsc sandbox, the real proxy and a real
//! Postgres. The HTTPS upstream lives in the test network namespace (scripts/netns.sh,
//! 198.51.100.2); only the PyPI tests leave the machine, to PyPI.

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use common::egress::{bundle_with_test_tenant, gateway_with};
use common::files_upstream::{FilesUpstream, HELLO, PACKAGE, REPO_README};
use common::upstream::{SECURE_HOST, UPSTREAM};
use common::{copy_of_shipped, fresh_database, TestGateway};

/// A small pure-Python package that is not in the image (so it must come from PyPI).
const PYPI_PACKAGE: &str = "tabulate";

/// Fails (never skips) when PyPI cannot be reached from this machine.
async fn require_pypi() {
    for host in ["pypi.org", "files.pythonhosted.org"] {
        let reachable = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect((host, 443)),
        )
        .await;
        assert!(
            matches!(reachable, Ok(Ok(_))),
            "PyPI is not reachable from this machine ({host}:443: {reachable:?}); these tests \
             install from it through the proxy, so they fail rather than skip"
        );
    }
}

/// The grant pip needs (the shipped tenant `acme` allows both hosts).
fn pypi_network() -> Value {
    json!([{"host": "pypi.org", "port": 443}, {"host": "files.pythonhosted.org", "port": 443}])
}

/// The execution's id and the JSON object its last stdout line holds (it must have succeeded).
fn last_json(body: &Value) -> (String, Value) {
    assert_eq!(body["status"], "succeeded", "{body:#}");
    let stdout = body["stdout"].as_str().unwrap();
    let last = stdout.lines().last().unwrap_or_default();
    let out = serde_json::from_str(last).unwrap_or_else(|err| panic!("{err}: {body:#}"));
    (body["id"].as_str().unwrap().to_owned(), out)
}

/// `(host, allow, reason)` of every connection row of an execution.
async fn connection_rows(gw: &TestGateway, id: &str) -> Vec<(String, bool, String)> {
    let pool = gw.pool().await;
    let rows = sqlx::query_as(
        "SELECT host, allow, reason FROM egress_connections WHERE execution_id = $1 \
         ORDER BY opened_at",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows
}

/// Python in a warm sandbox (its interpreter started before the job): `pip install x` with no
/// flag installs from PyPI through the proxy into `/workspace/.local`, and `import x` works in
/// the same interpreter right after, and in a new one.
#[tokio::test(flavor = "multi_thread")]
async fn pip_installs_from_pypi_without_flags_and_the_package_imports_at_once() {
    require_pypi().await;
    let gw = TestGateway::start_with(Some(fresh_database().await), |config| {
        config.warm_pool = [("python".to_owned(), 1)].into();
        config.python_preload = Vec::new();
    })
    .await;
    let key = gw.key("agent", "acme").await;
    let code = format!(
        r#"
import json, subprocess, sys
pip = subprocess.run(["pip", "install", "{PYPI_PACKAGE}"], capture_output=True, text=True)
out = {{"pip": pip.returncode, "pip_output": (pip.stdout + pip.stderr)[-3000:]}}
import {PYPI_PACKAGE}
out["here"] = {PYPI_PACKAGE}.__file__
fresh = subprocess.run([sys.executable, "-c", "import {PYPI_PACKAGE}; print({PYPI_PACKAGE}.__file__)"],
                       capture_output=True, text=True)
out["fresh"] = (fresh.stdout + fresh.stderr).strip()
print(json.dumps(out))
"#
    );
    common::warm::wait_for_waiting(&gw.http, &gw.url, "python").await;
    let extra = json!({"network": pypi_network(), "limits": {"timeout_ms": 60000}});
    let (status, body) = gw.execute(&key, "python", &code, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["start"], "warm", "{body:#}");
    let (id, out) = last_json(&body);
    assert_eq!(out["pip"], 0, "{}", out["pip_output"]);
    let user_site = "/workspace/.local/lib/python3";
    for case in ["here", "fresh"] {
        assert!(
            out[case].as_str().unwrap().starts_with(user_site),
            "{case}: {out:#}"
        );
    }
    let rows = connection_rows(&gw, &id).await;
    assert!(
        !rows.is_empty() && rows.iter().all(|(_, allow, _)| *allow),
        "{rows:?}"
    );
    gw.stop().await;
}

/// A coding agent's shell: `bash` runs in the python image, so pip (no flags, from PyPI through
/// the proxy), the installed package, pytest on an uploaded test, git and curl all work.
#[tokio::test(flavor = "multi_thread")]
async fn bash_has_the_coding_toolbox_pip_pytest_git_and_curl() {
    require_pypi().await;
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let script = format!(
        r#"set -eu
pip install --quiet {PYPI_PACKAGE}
python3 -c 'import {PYPI_PACKAGE}; print("imported", {PYPI_PACKAGE}.__file__)'
pytest -q test_calc.py
python3 -m pytest -q test_calc.py | tail -n 1
git --version
curl --version | head -n 1
"#
    );
    let test = "from calc import double\n\ndef test_double():\n    assert double(21) == 42\n";
    let b64 = base64::engine::general_purpose::STANDARD;
    let extra = json!({
        "network": pypi_network(),
        "limits": {"timeout_ms": 60000},
        "files": [
            {"path": "calc.py", "content_b64": b64.encode("def double(x):\n    return 2 * x\n")},
            {"path": "test_calc.py", "content_b64": b64.encode(test)},
        ],
    });
    let (status, body) = gw.execute(&key, "bash", &script, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body:#}");
    let stdout = body["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("imported /workspace/.local/lib/python3"),
        "{body:#}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("1 passed")).count(),
        2,
        "{body:#}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("git version ")),
        "{body:#}"
    );
    assert!(lines.iter().any(|l| l.starts_with("curl ")), "{body:#}");
    gw.stop().await;
}

/// What the sandbox runs against the file server: curl, git (dumb HTTP), requests, urllib, each
/// printing what it got. `$CA` names the trust flag-free tools need (empty: the environment's).
const FETCH_SH: &str = r#"set -u
curl -sS $CURL_CA https://secure.test/hello.txt | sed 's/^/curl: /'
git $GIT_CA clone -q https://secure.test/repo.git /tmp/repo && sed 's/^/git: /' /tmp/repo/README
python3 - <<'EOF'
import os, ssl, urllib.request
import requests
ca = os.environ.get("TEST_CA")
print("requests:", requests.get("https://secure.test/hello.txt", verify=ca or True, timeout=20).text, end="")
context = ssl.create_default_context(cafile=ca) if ca else None
print("urllib:", urllib.request.urlopen("https://secure.test/hello.txt", context=context, timeout=20).read().decode(), end="")
EOF
"#;

/// The lines a successful [`FETCH_SH`] prints.
fn fetched() -> Vec<String> {
    let hello = HELLO.trim_end();
    vec![
        format!("curl: {hello}"),
        format!("git: {}", REPO_README.trim_end()),
        format!("requests: {hello}"),
        format!("urllib: {hello}"),
    ]
}

/// Through a plain tunnel (no inspection: the proxy sees only CONNECT and the SNI), curl, git,
/// requests and urllib reach an HTTPS upstream whose CA the program names itself.
#[tokio::test(flavor = "multi_thread")]
async fn curl_git_requests_and_urllib_reach_an_https_upstream_through_a_tunnel() {
    let files = FilesUpstream::start().await;
    let policies = bundle_with_test_tenant(&[(SECURE_HOST, 443)]);
    let gw = gateway_with(policies.path(), &[(SECURE_HOST, UPSTREAM)]).await;
    let key = gw.key("agent", "nettest").await;
    let script = format!(
        "export CURL_CA='--cacert /workspace/ca.pem' GIT_CA='-c http.sslCAInfo=/workspace/ca.pem' \
         TEST_CA=/workspace/ca.pem\n{FETCH_SH}"
    );
    let ca =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(files.ca_file()).unwrap());
    let extra = json!({
        "network": [{"host": SECURE_HOST, "port": 443}],
        "files": [{"path": "ca.pem", "content_b64": ca}],
    });
    let (status, body) = gw.execute(&key, "bash", &script, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body:#}");
    let lines: Vec<&str> = body["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines, fetched(), "{body:#}");
    assert!(
        files
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /repo.git/")),
        "{:?}",
        files.requests()
    );
    let rows = connection_rows(&gw, body["id"].as_str().unwrap()).await;
    assert!(rows.len() >= 4, "{rows:?}");
    for (host, allow, reason) in &rows {
        assert_eq!(
            (host.as_str(), *allow, reason.as_str()),
            (SECURE_HOST, true, "egress.allowed")
        );
    }
    gw.stop().await;
}

/// The shipped bundle plus tenant `inspectall`: `secure.test:443` inspected, GET and HEAD on
/// every path allowed, nothing else.
fn inspected_bundle() -> tempfile::TempDir {
    let dir = copy_of_shipped();
    let tenants = dir.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let mut tenant = data["tenants"]["acme"].clone();
    let allow = json!([{"host": SECURE_HOST, "ports": [443], "inspect": true,
                        "requests": [{"methods": ["GET", "HEAD"], "paths": ["/"]}]}]);
    tenant["network"]["allow"] = serde_yaml_ng::to_value(allow).unwrap();
    tenant["network"]["review_unlisted_hosts"] = serde_yaml_ng::Value::Bool(false);
    data["tenants"]["inspectall"] = tenant;
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    dir
}

/// Through an inspected tunnel (the proxy terminates TLS with the execution's CA, the sandbox
/// trusts it through the environment), curl, git, requests, urllib and pip work with no trust
/// flag at all; every request is decided and recorded, and a refused one (DELETE) never reaches
/// the upstream.
#[tokio::test(flavor = "multi_thread")]
async fn curl_git_requests_urllib_and_pip_work_unchanged_through_inspection() {
    let files = FilesUpstream::start().await;
    let policies = inspected_bundle();
    let ca_file = files.ca_file();
    let url = fresh_database().await;
    let dir = policies.path().to_owned();
    let gw = TestGateway::start_with(Some(url), move |config| {
        config.policy_dir = dir;
        config.egress_ca_file = Some(ca_file);
        config
            .egress_hosts
            .insert(SECURE_HOST.to_owned(), vec![UPSTREAM.parse().unwrap()]);
    })
    .await;
    let key = gw.key("agent", "inspectall").await;
    let script = format!(
        "export CURL_CA= GIT_CA= TEST_CA=\n{FETCH_SH}\
         pip install --quiet --index-url https://{SECURE_HOST}/simple/ {PACKAGE}\n\
         python3 -c 'import {PACKAGE}; print(\"pip:\", {PACKAGE}.VALUE)'\n\
         curl -sS -X DELETE https://{SECURE_HOST}/hello.txt\n"
    );
    let extra = json!({"network": [{"host": SECURE_HOST, "port": 443}]});
    let (status, body) = gw.execute(&key, "bash", &script, extra).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body:#}");
    let lines: Vec<&str> = body["stdout"].as_str().unwrap().lines().collect();
    let mut expected = fetched();
    expected.push("pip: 42".to_owned());
    assert_eq!(lines[..expected.len()], expected, "{body:#}");
    assert!(
        lines[expected.len()].starts_with("sandgate-egress: egress.method_not_allowed: "),
        "{body:#}"
    );
    let reached = files.requests();
    assert!(reached.iter().all(|r| r.starts_with("GET ")), "{reached:?}");
    assert!(
        reached.contains(&format!("GET /simple/{PACKAGE}/ auth=-")),
        "{reached:?}"
    );

    let pool = gw.pool().await;
    let rows: Vec<(String, String, bool, String)> = sqlx::query_as(
        "SELECT method, path, allow, reason FROM egress_requests WHERE execution_id = $1 \
         ORDER BY started_at, id",
    )
    .bind(body["id"].as_str().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    let allowed = rows.iter().filter(|row| row.2).count();
    assert_eq!(
        allowed,
        reached.len(),
        "one row per request that reached it: {rows:#?}"
    );
    assert_eq!(
        rows.iter().filter(|row| !row.2).collect::<Vec<_>>(),
        vec![&(
            "DELETE".to_owned(),
            "/hello.txt".to_owned(),
            false,
            "egress.method_not_allowed".to_owned()
        )],
        "{rows:#?}"
    );
    gw.stop().await;
}

/// A refused CONNECT says why in its status line, so clients that show only that line show the
/// reason: `curl -v`, Python's `requests` and `urllib` (`Tunnel connection failed: 403
/// sandgate-egress: egress.host_not_granted: ...`) and pip; a refused plain-HTTP request has it
/// in the body too. Nothing reaches any upstream and each attempt has its row.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connect_names_its_reason_to_curl_requests_urllib_and_pip() {
    let policies = bundle_with_test_tenant(&[(SECURE_HOST, 443)]);
    let gw = gateway_with(policies.path(), &[(SECURE_HOST, UPSTREAM)]).await;
    let key = gw.key("agent", "nettest").await;
    let code = r#"
import json, subprocess, urllib.request
import requests
def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return p.stdout + p.stderr
out = {"curl": run(["curl", "-sS", "-v", "https://denied.test/"]),
       "curl_http": run(["curl", "-sS", "http://denied.test/"]),
       "pip": run(["pip", "install", "--retries", "1", "--index-url", "https://denied.test/simple/", "x"])}
try:
    requests.get("https://denied.test/", timeout=20)
except Exception as e:
    out["requests"] = str(e)
try:
    urllib.request.urlopen("https://denied.test/", timeout=20)
except Exception as e:
    out["urllib"] = str(e)
print(json.dumps(out))
"#;
    let extra = json!({"network": [{"host": SECURE_HOST, "port": 443}]});
    let (status, body) = gw.execute(&key, "python", code, extra).await;
    assert_eq!(status, 200, "{body}");
    let (id, out) = last_json(&body);
    let phrase = "403 sandgate-egress: egress.host_not_granted: ";
    let tunnel_failed = format!("Tunnel connection failed: {phrase}");
    let expect = |case: &str, text: &str| {
        assert!(
            out[case].as_str().unwrap().contains(text),
            "{case}: {out:#}"
        );
    };
    expect("curl", &format!("< HTTP/1.1 {phrase}"));
    expect("curl", "< X-Sandgate-Reason: egress.host_not_granted");
    expect("curl_http", "sandgate-egress: egress.host_not_granted: ");
    expect("requests", &tunnel_failed);
    expect("urllib", &tunnel_failed);
    expect("pip", &tunnel_failed);
    let rows = connection_rows(&gw, &id).await;
    assert!(rows.len() >= 4, "{rows:?}");
    for (host, allow, reason) in &rows {
        assert_eq!(
            (host.as_str(), *allow, reason.as_str()),
            ("denied.test", false, "egress.host_not_granted")
        );
    }
    gw.stop().await;
}
