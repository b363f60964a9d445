//! `sandgate repl` and `sandgate exec --session`, the real binary against a live gateway (real
//! dockerd, runsc, PostgreSQL): driven through piped stdin, and through a real pseudo-terminal
//! (`repl/drive_pty.py`: typing, history, a block, Ctrl-C while code runs and at the prompt,
//! Ctrl-D), then the API shows the session closed (`deleted`) and its container gone.

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{python_venv, workspace_root, TestGateway};
use serde_json::json;

/// `sandgate ARGS` with `stdin` piped in, the key in the environment.
async fn sandgate(gw: &TestGateway, key: &str, args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command
        .args(args)
        .args(["--url", &gw.url])
        .env("SANDGATE_KEY", key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let stdin = stdin.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

/// The id in the repl's opening line `sandgate: session ss_... (`.
fn session_id(stderr: &str) -> String {
    let after = stderr
        .split("sandgate: session ")
        .nth(1)
        .unwrap_or_else(|| panic!("no session line in {stderr}"));
    after.split_whitespace().next().unwrap().to_owned()
}

/// The session is closed as `deleted` and its container is gone.
async fn assert_closed_by_client(gw: &TestGateway, key: &str, id: &str) {
    let (status, session) = gw.get(key, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["status"], "closed", "{session}");
    assert_eq!(session["closed_reason"], "deleted", "{session}");
    let container = session["container"].as_str().unwrap();
    let listed = Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("name=^/{container}$"),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).trim().is_empty(),
        "the closed session's container {container} is still there"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn repl_from_piped_stdin_keeps_state_prints_results_and_closes_at_the_end() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let cells = "x = 41\nx + 1\ndef double(a):\n    if a:\n        return a * 2\n\n\
                 double(x)\nimport sys; print('to stderr', file=sys.stderr)\n1 / 0\n\
                 print('alive', x)\n";
    let out = sandgate(&gw, &agent, &["repl"], cells).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "42\n82\nalive 41\n", "stderr: {stderr}");
    assert!(stderr.contains("to stderr"), "{stderr}");
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
    assert!(
        !stderr.contains(">>>"),
        "no prompts on piped stdin: {stderr}"
    );
    assert_closed_by_client(&gw, &agent, &session_id(&stderr)).await;

    // bash: one shell across cells; a failing cell says its exit code.
    let out = sandgate(
        &gw,
        &agent,
        &["repl", "--lang", "bash"],
        "cd /tmp; export A=1\nf() {\n  echo fn $A\n}\n\npwd; f\nfalse\n",
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/tmp\nfn 1\n",
        "{stderr}"
    );
    assert!(stderr.contains("exit code 1"), "{stderr}");

    // A session the policy refuses: the reasons, exit 77, nothing left open.
    let classroom = gw.key("agent", "classroom").await;
    let out = sandgate(&gw, &classroom, &["repl"], "1\n").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert!(stderr.contains("session.not_allowed"), "{stderr}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_with_session_runs_in_the_open_session_and_prints_the_result() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let (status, opened) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{opened}");
    let id = opened["id"].as_str().unwrap();
    let exec = ["exec", "--file", "-", "--session", id];
    let out = sandgate(&gw, &agent, &exec, "x = 41\nprint('set')\n").await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "set\n");
    let out = sandgate(&gw, &agent, &exec, "x + 1\n").await;
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    let out = sandgate(&gw, &agent, &exec, "raise SystemExit(4)\n").await;
    assert_eq!(out.status.code(), Some(4));

    // Another tenant's agent cannot reach it: 404, said plainly.
    let stranger = gw.key("agent", "forge").await;
    let out = sandgate(&gw, &stranger, &exec, "x\n").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("404"), "{stderr}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn repl_in_a_terminal_edits_interrupts_and_closes_with_ctrl_d() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let script = workspace_root().join("gateway/tests/repl/drive_pty.py");
    let python = python_venv().join("bin/python");
    let url = gw.url.clone();
    let key = agent.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args([env!("CARGO_BIN_EXE_sandgate"), url.as_str()])
            .env("SANDGATE_KEY", key)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout);
    println!("{transcript}");
    assert!(
        out.status.success(),
        "{transcript}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = session_id(&transcript);
    assert_closed_by_client(&gw, &agent, &id).await;

    // The Ctrl-C cancelled exactly the running cell: one record `cancelled`, in this session.
    let (_, listed) = gw.get(&agent, "/v1/executions?status=cancelled").await;
    let cancelled: Vec<_> = listed["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|execution| execution["session_id"] == id.as_str())
        .collect();
    assert_eq!(cancelled.len(), 1, "{listed}");
    gw.stop().await;
}

/// A session the policy holds for review: the repl says it waits (naming the approval), and
/// once a reviewer approves it runs the cells in the now `ready` session.
#[tokio::test(flavor = "multi_thread")]
async fn repl_waits_for_a_held_session_to_be_approved_then_runs_its_cells() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let reviewer = gw.key("reviewer", "acme").await;
    let args = ["repl", "--net", "review.example:443"];
    let running = sandgate(&gw, &agent, &args, "x = 1\nx + 1\n");
    let approve = async {
        for _ in 0..300 {
            let (_, listed) = gw.get(&agent, "/v1/sessions").await;
            let held = listed["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["status"] == "pending_approval")
                .cloned();
            if let Some(held) = held {
                let approval = held["approval_id"].as_str().unwrap();
                let path = format!("/v1/approvals/{approval}");
                let (status, body) = gw
                    .post(&reviewer, &path, &json!({"decision": "approve"}))
                    .await;
                assert_eq!(status, 200, "{body}");
                return held["approval_id"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the repl's session was never held for review");
    };
    let (out, approval) = tokio::join!(running, approve);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("waits for human review (approval {approval})")),
        "{stderr}"
    );
    assert_eq!(stdout.trim(), "2", "{stderr}");
    let id = session_id(&stderr);
    assert_closed_by_client(&gw, &agent, &id).await;
    gw.stop().await;
}
