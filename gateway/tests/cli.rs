//! The real `sandgate` binary, as a user runs it: `serve` with the embedded default database,
//! `keys create` against the same instance, one execution, and a clean shutdown that stops the
//! private PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

fn sandgate(data_dir: &std::path::Path, listen: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command
        .env_remove("SANDGATE_DATABASE_URL")
        .env("SANDGATE_DATA_DIR", data_dir)
        .env("SANDGATE_LISTEN", listen)
        .env(
            "SANDGATE_POLICY_DIR",
            common::workspace_root().join("policies"),
        )
        .env("SANDGATE_SANDBOX_INIT", common::sandbox_init());
    command
}

/// A data directory the embedded cluster's `postgres` user can enter, and a free loopback port.
fn data_dir_and_listen() -> (tempfile::TempDir, String) {
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (data, format!("127.0.0.1:{port}"))
}

/// `sandgate serve`, once it answers `/healthz`.
async fn serve(
    data: &std::path::Path,
    listen: &str,
    http: &reqwest::Client,
) -> std::process::Child {
    let mut server = sandgate(data, listen)
        .arg("serve")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_healthy(http, &format!("http://{listen}"), &mut server).await;
    server
}

/// SIGTERM, then the exit status.
async fn terminate(mut server: std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap()
}

/// `sandgate keys create`: the key is the last line of stdout.
fn create_key(data: &std::path::Path, listen: &str, role: &str, tenant: &str) -> String {
    let output = sandgate(data, listen)
        .args(["keys", "create", "--role", role, "--tenant", tenant])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let key = stdout.lines().last().unwrap().trim().to_owned();
    assert!(key.starts_with("sgk_"), "{stdout}");
    key
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_keys_execute_and_shut_down_with_embedded_postgres() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");

    let response = http
        .post(format!("{base}/v1/executions"))
        .bearer_auth(&key)
        .json(&json!({"language": "python", "code": "print(6*7)", "wait": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["stdout"], "42\n", "{body}");

    // SIGHUP reloads the policy directory.
    let admin = create_key(data.path(), &listen, "admin", "ops");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let mut loaded_by = serde_json::Value::Null;
    for _ in 0..100 {
        let policy: serde_json::Value = http
            .get(format!("{base}/v1/policy"))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        loaded_by = policy["loaded_by"].clone();
        if loaded_by == "sighup" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(loaded_by, "sighup", "SIGHUP did not reload the policy");

    // Only the hash of the key is stored.
    let pg_data = data.path().join("pg/data");
    assert!(
        pg_data.join("postmaster.pid").exists(),
        "embedded PostgreSQL is running"
    );
    let dump = Command::new("grep")
        .args(["-r", "-l", &key])
        .arg(&pg_data)
        .output()
        .unwrap();
    assert!(
        dump.stdout.is_empty(),
        "the key itself is stored in the database files"
    );

    let status = terminate(server).await;
    assert!(status.success(), "sandgate serve exited with {status}");
    assert!(
        !pg_data.join("postmaster.pid").exists(),
        "embedded PostgreSQL still running after shutdown"
    );
}

async fn wait_healthy(http: &reqwest::Client, base: &str, server: &mut std::process::Child) {
    for _ in 0..600 {
        if let Ok(Some(status)) = server.try_wait() {
            panic!("sandgate serve exited: {status}");
        }
        if let Ok(response) = http.get(format!("{base}/healthz")).send().await {
            if response.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sandgate serve did not come up");
}

/// kill -9 of the gateway mid-execution, then a restart: no container is left behind and the
/// record says what happened.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_execution_then_restart_leaves_no_container_and_a_truthful_record() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    let mut server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");

    let created: serde_json::Value = http
        .post(format!("{base}/v1/executions"))
        .bearer_auth(&key)
        .json(&json!({"language": "bash", "code": "sleep 25", "wait": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let mut started = false;
    for _ in 0..200 {
        if !common::containers_of(&id).is_empty() {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started, "the sandbox never started");

    server.kill().unwrap();
    server.wait().unwrap();
    assert!(
        !common::containers_of(&id).is_empty(),
        "the container outlives the killed gateway"
    );

    let server = serve(data.path(), &listen, &http).await;
    let mut record = serde_json::Value::Null;
    for _ in 0..200 {
        record = http
            .get(format!("{base}/v1/executions/{id}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if record["status"] == "error" && common::containers_of(&id).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(record["status"], "error", "{record}");
    assert!(record["finished_at"].is_string(), "{record}");
    assert!(
        common::containers_of(&id).is_empty(),
        "container left behind"
    );

    let status = terminate(server).await;
    assert!(status.success(), "{status}");
    assert!(
        !data.path().join("pg/data/postmaster.pid").exists(),
        "the restarted gateway adopted and stopped the embedded PostgreSQL"
    );
}
