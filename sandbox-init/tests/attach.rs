//! The attach supervisor and the signal request (`sandbox_protocol`'s `procs` module), the
//! real binary run as an ordinary process on the host: stdio passes straight through, the
//! exit status is the program's, a signal request reaches the program's group by tag.

#![allow(
    clippy::unwrap_used,
    reason = "helpers of an integration test: a panic is a test failure"
)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const INIT: &str = env!("CARGO_BIN_EXE_sandbox-init");

fn attach(tag: &str, script: &str) -> std::process::Child {
    Command::new(INIT)
        .args(["attach", tag, "--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(tag: &str, name: &str) -> i32 {
    Command::new(INIT)
        .args(["signal", tag, name])
        .status()
        .unwrap()
        .code()
        .unwrap()
}

#[test]
fn stdio_passes_through_and_the_status_is_the_program_s() {
    let mut child = attach(
        "t_stdio",
        "read line; echo \"got $line\"; echo err >&2; exit 3",
    );
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn a_kill_request_reaches_the_program_s_group_by_tag() {
    let tag = format!("t_kill_{}", std::process::id());
    let child = attach(&tag, "sleep 30 & sleep 30; echo never");
    // The supervisor is found by its command line once it runs.
    let started = Instant::now();
    while signal(&tag, "KILL") != 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "never found");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(137), "killed by SIGKILL: 128 + 9");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(signal(&tag, "KILL"), 1, "nothing of that tag runs any more");
}

#[test]
fn bad_requests_are_refused() {
    for args in [
        &["attach", "a b", "--", "true"][..],
        &["attach", "t_1", "true"],
        &["signal", "t_1", "STOP"],
    ] {
        let status = Command::new(INIT).args(args).status().unwrap();
        assert_eq!(status.code(), Some(125), "{args:?}");
    }
}
