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

#[tokio::test(flavor = "multi_thread")]
async fn serve_keys_execute_and_shut_down_with_embedded_postgres() {
    common::require_docker();
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
    let listen = format!("127.0.0.1:{port}");
    let mut server = sandgate(data.path(), &listen)
        .arg("serve")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();

    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let mut healthy = false;
    for _ in 0..600 {
        if let Ok(Some(status)) = server.try_wait() {
            panic!("sandgate serve exited: {status}");
        }
        if let Ok(response) = http.get(format!("{base}/healthz")).send().await {
            healthy = response.status().is_success();
            if healthy {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(healthy, "sandgate serve did not come up");

    let output = sandgate(data.path(), &listen)
        .args(["keys", "create", "--role", "agent", "--tenant", "acme"])
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
    let output = sandgate(data.path(), &listen)
        .args(["keys", "create", "--role", "admin", "--tenant", "ops"])
        .output()
        .unwrap();
    let admin = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_owned();
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

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "sandgate serve exited with {status}");
    assert!(
        !pg_data.join("postmaster.pid").exists(),
        "embedded PostgreSQL still running after shutdown"
    );
}
