//! Ctrl-C in `sandgate exec`, the real binary against a live gateway (real dockerd, runsc,
//! PostgreSQL): SIGINT to the client cancels the execution on the gateway, which records it
//! `cancelled` at once (not at its timeout), and the client prints that and exits 130; in a
//! session, it interrupts the running cell and the session stays open.

use crate::common;

use std::io::BufRead;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::TestGateway;
use serde_json::json;

/// Far longer than the policy's 30 s wall-time limit: only a cancel ends it promptly.
const SLEEPER: &str = "import time\nprint('started', flush=True)\ntime.sleep(120)\n";
/// How long after Ctrl-C the client must have exited, and the record ended.
const PROMPTLY: Duration = Duration::from_secs(15);

/// `sandgate exec ARGS --file <program>` against `gw`, stdout and stderr piped.
fn spawn_exec(gw: &TestGateway, key: &str, program: &std::path::Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .arg("exec")
        .args(args)
        .arg("--file")
        .arg(program)
        .args(["--url", &gw.url])
        .env("SANDGATE_KEY", key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the program's first line (it is running), sends SIGINT to the client, and returns
/// when it did, the client's exit status and its stderr.
async fn interrupt_once_started(mut child: Child) -> (DateTime<Utc>, ExitStatus, String) {
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    });
    let first = tokio::time::timeout(Duration::from_secs(60), first)
        .await
        .expect("the program did not start within 60 s")
        .unwrap();
    assert_eq!(first, "started\n");
    let interrupted_at = Utc::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap());
    let status = tokio::time::timeout(PROMPTLY, status)
        .await
        .expect("sandgate exec did not exit promptly after Ctrl-C")
        .unwrap();
    (interrupted_at, status, stderr.join().unwrap())
}

/// The record's `finished_at`, checked to be within [`PROMPTLY`] of `interrupted_at`.
fn assert_ended_promptly(record: &serde_json::Value, interrupted_at: DateTime<Utc>) {
    let finished: DateTime<Utc> = record["finished_at"].as_str().unwrap().parse().unwrap();
    let after = (finished - interrupted_at).to_std().unwrap_or_default();
    assert!(after < PROMPTLY, "ended {after:?} after Ctrl-C: {record}");
}

#[tokio::test]
async fn ctrl_c_in_exec_cancels_the_execution_and_exits_130() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("sleeper.py");
    std::fs::write(&program, SLEEPER).unwrap();

    let child = spawn_exec(&gw, &key, &program, &[]);
    let (interrupted_at, status, stderr) = interrupt_once_started(child).await;
    assert_eq!(status.code(), Some(130), "{status:?}; stderr: {stderr}");
    let id = stderr
        .split("sandgate: execution ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no execution id in {stderr}"))
        .to_owned();
    assert!(
        stderr.contains(&format!("sandgate: execution {id} ended: cancelled")),
        "{stderr}"
    );

    let (code, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(code, 200, "{record}");
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_ended_promptly(&record, interrupted_at);
    gw.stop().await;
}

#[tokio::test]
async fn ctrl_c_in_exec_session_interrupts_the_cell_and_the_session_stays_open() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (code, session) = gw
        .post(&key, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(code, 201, "{session}");
    let session_id = session["id"].as_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("sleeper.py");
    std::fs::write(&program, SLEEPER).unwrap();

    // A session answers when the cell ended: its output comes after, so wait for it to run.
    let child = spawn_exec(&gw, &key, &program, &["--session", &session_id]);
    let id = running_in(&gw, &key, &session_id).await;
    let interrupted_at = Utc::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap());
    let output = tokio::time::timeout(PROMPTLY, output)
        .await
        .expect("sandgate exec --session did not exit promptly after Ctrl-C")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "stderr: {stderr}");
    assert!(
        stderr.contains(&format!("sandgate: execution {id} ended: cancelled")),
        "{stderr}"
    );
    let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_ended_promptly(&record, interrupted_at);

    let (_, session) = gw.get(&key, &format!("/v1/sessions/{session_id}")).await;
    assert_eq!(session["status"], "ready", "{session}");
    gw.stop().await;
}

/// The id of the execution running in `session`, once there is one.
async fn running_in(gw: &TestGateway, key: &str, session: &str) -> String {
    for _ in 0..600 {
        let (_, page) = gw.get(key, "/v1/executions?status=running&limit=100").await;
        let running = page["executions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|execution| execution["session_id"] == session);
        if let Some(execution) = running {
            return execution["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing ran in session {session} within 60 s");
}
