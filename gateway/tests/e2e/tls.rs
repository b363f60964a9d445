//! The API over HTTPS (config `tls`), with certificates this test makes (rcgen): a client that
//! trusts the CA gets the API, plain HTTP and untrusting clients get nothing; with
//! `client_ca_file` a handshake without a client certificate, or with one from another CA, is
//! refused, and the Python SDK and `sandgate mcp` work over it with the right files.

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use common::{fresh_database, python_venv, require_docker, test_config, workspace_root};
use gateway::audit::AuditStore;
use gateway::config::Tls;
use gateway::runtime::docker::DockerRuntime;

/// A CA and its key.
struct Authority {
    cert: Certificate,
    key: KeyPair,
}

fn authority(name: &str) -> Authority {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    Authority {
        cert: params.self_signed(&key).unwrap(),
        key,
    }
}

/// A certificate for `names` signed by `ca`, written as `<stem>.pem` and `<stem>.key`.
fn leaf(dir: &Path, stem: &str, names: &[&str], ca: &Authority, usage: ExtendedKeyUsagePurpose) {
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params.distinguished_name.push(DnType::CommonName, stem);
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
    std::fs::write(dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
}

/// Server, client and stranger certificates; `ca.pem` signs the server, `client-ca.pem` the
/// client, and the stranger's CA is trusted by nobody.
fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca, other) = (
        authority("server ca"),
        authority("client ca"),
        authority("other"),
    );
    std::fs::write(dir.path().join("ca.pem"), server_ca.cert.pem()).unwrap();
    std::fs::write(dir.path().join("client-ca.pem"), client_ca.cert.pem()).unwrap();
    let server = ExtendedKeyUsagePurpose::ServerAuth;
    let client = ExtendedKeyUsagePurpose::ClientAuth;
    leaf(
        dir.path(),
        "server",
        &["localhost", "127.0.0.1"],
        &server_ca,
        server,
    );
    leaf(dir.path(), "client", &["agent"], &client_ca, client.clone());
    leaf(dir.path(), "stranger", &["agent"], &other, client);
    dir
}

struct HttpsGateway {
    url: String,
    database_url: String,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), gateway::ServeError>>,
    _data: tempfile::TempDir,
}

impl HttpsGateway {
    async fn start(pki: &Path, require_client_cert: bool) -> HttpsGateway {
        require_docker();
        let database_url = fresh_database().await;
        let data = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            data.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut config = test_config(Some(database_url.clone()), data.path());
        config.tls = Some(Tls {
            cert_file: pki.join("server.pem"),
            key_file: pki.join("server.key"),
            client_ca_file: require_client_cert.then(|| pki.join("client-ca.pem")),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(gateway::serve_on(
            listener,
            config,
            Arc::new(DockerRuntime::new()),
            shutdown.clone(),
        ));
        let gw = HttpsGateway {
            url: format!("https://localhost:{port}"),
            database_url,
            shutdown,
            server,
            _data: data,
        };
        let client = https_client(pki, require_client_cert.then_some("client"));
        for _ in 0..600 {
            assert!(
                !gw.server.is_finished(),
                "the gateway exited during start-up"
            );
            if let Ok(response) = client.get(format!("{}/healthz", gw.url)).send().await {
                if response.status().is_success() {
                    return gw;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the HTTPS gateway did not become healthy within 30 s");
    }

    async fn agent_key(&self) -> String {
        let pool = sqlx::PgPool::connect(&self.database_url).await.unwrap();
        let key = AuditStore::new(pool.clone())
            .create_key("agent", "acme")
            .await
            .unwrap();
        pool.close().await;
        key.secret
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(90), self.server)
            .await
            .expect("gateway shut down in time")
            .expect("gateway task");
        result.expect("gateway exited cleanly");
    }
}

/// A client trusting `ca.pem`, presenting `<identity>.pem` when given.
fn https_client(pki: &Path, identity: Option<&str>) -> reqwest::Client {
    let ca = std::fs::read(pki.join("ca.pem")).unwrap();
    let mut builder = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .timeout(Duration::from_secs(120));
    if let Some(stem) = identity {
        let mut pem = std::fs::read(pki.join(format!("{stem}.pem"))).unwrap();
        pem.extend(std::fs::read(pki.join(format!("{stem}.key"))).unwrap());
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

fn path_str(path: PathBuf) -> String {
    path.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_is_served_over_https_only_to_clients_that_trust_it() {
    let pki = pki();
    let gw = HttpsGateway::start(pki.path(), false).await;
    let key = gw.agent_key().await;
    let client = https_client(pki.path(), None);
    let ran: Value = client
        .post(format!("{}/v1/executions", gw.url))
        .bearer_auth(&key)
        .json(&json!({"language": "python", "code": "print('over tls')"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ran["status"], "succeeded", "{ran}");
    assert_eq!(ran["stdout"], "over tls\n");

    let plain = gw.url.replace("https://", "http://");
    let answer = reqwest::get(format!("{plain}/healthz")).await;
    assert!(answer.is_err(), "plain HTTP was answered: {answer:?}");
    let untrusting = reqwest::Client::builder().build().unwrap();
    let answer = untrusting.get(format!("{}/healthz", gw.url)).send().await;
    assert!(
        answer.is_err(),
        "a client without the CA was answered: {answer:?}"
    );

    // `sandgate mcp` and `sandgate exec` reach an https:// gateway with --ca-file.
    let url = gw.url.clone();
    let ca = path_str(pki.path().join("ca.pem"));
    let (said, printed) = tokio::task::spawn_blocking(move || {
        (
            mcp_over_stdio(&url, &key, &["--ca-file", &ca]),
            exec_over_https(&url, &key, &["--ca-file", &ca]).unwrap(),
        )
    })
    .await
    .unwrap();
    assert!(
        said.contains("status: succeeded") && said.contains("from mcp"),
        "{said}"
    );
    assert_eq!(printed, "from exec\n");
    gw.stop().await;
}

/// `sandgate exec` with `tls` (`--ca-file`, ...) and a program on stdin: its stdout, or its
/// stderr when it failed.
fn exec_over_https(url: &str, key: &str, tls: &[&str]) -> Result<String, String> {
    piped(
        &["exec", "--file", "-", "--url", url, "--key", key],
        tls,
        "print('from exec')\n",
    )
}

/// `sandgate ARGS TLS` with `stdin`: its stdout, or its stderr when it failed.
fn piped(args: &[&str], tls: &[&str], stdin: &str) -> Result<String, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .args(tls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// One `tools/call` through `sandgate mcp` with `tls`; its stdout.
fn mcp_over_stdio(url: &str, key: &str, tls: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["mcp", "--url", url, "--key", key])
        .args(tls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "run_code", "arguments": {"code": "print('from mcp')"}}});
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{call}").unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "sandgate mcp failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_client_ca_only_clients_with_its_certificates_are_served() {
    let pki = pki();
    let gw = HttpsGateway::start(pki.path(), true).await;
    let healthz = format!("{}/healthz", gw.url);
    let none = https_client(pki.path(), None).get(&healthz).send().await;
    assert!(
        none.is_err(),
        "served without a client certificate: {none:?}"
    );
    let stranger = https_client(pki.path(), Some("stranger"))
        .get(&healthz)
        .send()
        .await;
    assert!(
        stranger.is_err(),
        "served a certificate of another CA: {stranger:?}"
    );
    let good = https_client(pki.path(), Some("client"))
        .get(&healthz)
        .send()
        .await
        .unwrap();
    assert_eq!(good.status(), 200);

    // The command-line clients with the CA and the client certificate; without it, refused.
    let key = gw.agent_key().await;
    let (url, dir, agent) = (gw.url.clone(), pki.path().to_owned(), key.clone());
    let (exec, repl, mcp, refused) = tokio::task::spawn_blocking(move || {
        let (ca, cert, cert_key) = (
            path_str(dir.join("ca.pem")),
            path_str(dir.join("client.pem")),
            path_str(dir.join("client.key")),
        );
        let tls = [
            "--ca-file",
            &ca,
            "--client-cert",
            &cert,
            "--client-key",
            &cert_key,
        ];
        let repl = ["repl", "--url", &url, "--key", &agent];
        (
            exec_over_https(&url, &agent, &tls),
            piped(&repl, &tls, "x = 41\nx + 1\n"),
            mcp_over_stdio(&url, &agent, &tls),
            exec_over_https(&url, &agent, &tls[..2]),
        )
    })
    .await
    .unwrap();
    assert_eq!(exec.unwrap(), "from exec\n");
    assert_eq!(repl.unwrap(), "42\n", "sandgate repl over mutual TLS");
    assert!(
        mcp.contains("status: succeeded") && mcp.contains("from mcp"),
        "{mcp}"
    );
    let refused = refused.unwrap_err();
    assert!(
        refused.contains("cannot reach the gateway"),
        "without a client certificate: {refused}"
    );

    // The Python SDK with the CA and the client certificate.
    let dir = pki.path().to_owned();
    let url = gw.url.clone();
    let output = tokio::task::spawn_blocking(move || {
        let script = "import os, sandgate\n\
            c = sandgate.Client(os.environ['URL'], os.environ['KEY'], ca_file=os.environ['CA'],\n\
                                cert=(os.environ['CERT'], os.environ['CERT_KEY']))\n\
            print(c.run('print(6 * 7)').stdout, end='')\n";
        Command::new(python_venv().join("bin/python"))
            .args(["-c", script])
            .env("PYTHONPATH", workspace_root().join("clients/python/src"))
            .env("URL", url)
            .env("KEY", key)
            .env("CA", dir.join("ca.pem"))
            .env("CERT", dir.join("client.pem"))
            .env("CERT_KEY", dir.join("client.key"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    gw.stop().await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "42\n");
}
