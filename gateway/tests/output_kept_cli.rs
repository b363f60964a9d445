//! `sandgate exec` prints every byte of a large single write (issue 21, item 1): the real
//! binary serving with its embedded database, and the real client. Cold, and warm (a pooled
//! sandbox) with `SANDGATE_TEST_START=warm`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::warm::{mode, Start};

fn sandgate(data_dir: &std::path::Path, listen: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    let pool = match mode() {
        Start::Cold => "{}",
        Start::Warm => "{python: 1}",
    };
    command
        .env_remove("SANDGATE_DATABASE_URL")
        .env("SANDGATE_DATA_DIR", data_dir)
        .env("SANDGATE_LISTEN", listen)
        .env(
            "SANDGATE_POLICY_DIR",
            common::workspace_root().join("policies"),
        )
        .env("SANDGATE_SANDBOX_INIT", common::sandbox_init())
        .env("SANDGATE_WARM_POOL", pool)
        .env("SANDGATE_PYTHON_PRELOAD", "[]")
        .env_remove("SANDGATE_TEST_START");
    command
}

/// `sandgate serve`, killed if the test fails before it stops it (it would hold the test
/// harness's output open).
struct Server(Option<std::process::Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut server) = self.0.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
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

fn create_key(data: &std::path::Path, listen: &str) -> String {
    let output = sandgate(data, listen)
        .args(["keys", "create", "--role", "agent", "--tenant", "acme"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    stdout.lines().last().unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn sandgate_exec_prints_a_large_print_whole() {
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
    let http = reqwest::Client::new();
    let mut server = Server(Some(
        sandgate(data.path(), &listen)
            .arg("serve")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    wait_healthy(
        &http,
        &format!("http://{listen}"),
        server.0.as_mut().unwrap(),
    )
    .await;
    let key = create_key(data.path(), &listen);
    if mode() == Start::Warm {
        common::warm::wait_for_waiting(&http, &format!("http://{listen}"), "python").await;
    }

    let work = tempfile::tempdir().unwrap();
    let program = work.path().join("big.py");
    std::fs::write(&program, "print('a' * 200000)\n").unwrap();
    let run = sandgate(data.path(), &listen)
        .arg("exec")
        .arg("--file")
        .arg(&program)
        .env("SANDGATE_KEY", &key)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let mut want = vec![b'a'; 200_000];
    want.push(b'\n');
    assert!(
        run.stdout == want,
        "printed {} bytes, want 200001: {stderr}",
        run.stdout.len()
    );

    // The stored record, through the API: whole, not truncated, and as warm as asked.
    let id = stderr
        .lines()
        .find_map(|line| line.trim().strip_prefix("sandgate: execution "))
        .unwrap_or_else(|| panic!("{stderr}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let record: serde_json::Value = http
        .get(format!("http://{listen}/v1/executions/{id}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["stdout"].as_str().unwrap().len(), 200_001);
    assert_eq!(record["stdout_truncated"], false);
    let start = match mode() {
        Start::Cold => "cold",
        Start::Warm => "warm",
    };
    assert_eq!(record["start"], start, "{}", record["status"]);

    let mut server = server.0.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}
