//! The real binary, run as an ordinary process on the host (not PID 1: it marks itself a child
//! subreaper, so orphans still come back to it). The same cases run inside gVisor as PID 1 in
//! `tests/runsc-smoke.sh`.

#![allow(
    clippy::unwrap_used,
    reason = "helpers of an integration test: a panic is a test failure"
)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

const INIT: &str = env!("CARGO_BIN_EXE_sandbox-init");

fn spawn_init() -> Child {
    Command::new(INIT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn send_spec(init: &mut Child, spec: &str) {
    let mut stdin = init.stdin.take().unwrap();
    stdin.write_all(spec.as_bytes()).unwrap();
    stdin.write_all(b"\n").unwrap();
}

fn start(spec: &str) -> Child {
    let mut init = spawn_init();
    send_spec(&mut init, spec);
    init
}

fn run(spec: &str) -> Output {
    start(spec).wait_with_output().unwrap()
}

/// A spec that writes `script` to a fresh directory under /tmp and runs it with `sh`.
fn script_spec(dir: &Path, script: &str) -> String {
    let path = dir.join("sandgate/main.sh");
    json!({
        "argv": ["sh", path],
        "cwd": dir,
        "files": [{
            "path": path,
            "content_b64": base64::engine::general_purpose::STANDARD.encode(script),
        }],
    })
    .to_string()
}

fn tmp() -> tempfile::TempDir {
    // Under /tmp: the only writable root that exists on a host.
    tempfile::Builder::new()
        .prefix("sandgate-init-")
        .tempdir_in("/tmp")
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn passes_output_through_and_returns_the_exit_status() {
    let dir = tmp();
    let out = run(&script_spec(
        dir.path(),
        "echo hi; echo err >&2; pwd; cat; echo \"stdin done\"; exit 3",
    ));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let expected = format!("hi\n{}\nstdin done\n", dir.path().display());
    assert_eq!(text(&out.stdout), expected);
    assert_eq!(text(&out.stderr), "err\n");
}

#[test]
fn exit_nonce_ends_stderr_with_the_trailer_even_when_the_init_fails() {
    let nonce = "0123456789abcdefABCDEF";
    let dir = tmp();
    let mut spec: serde_json::Value =
        serde_json::from_str(&script_spec(dir.path(), "echo out; echo err >&2; exit 3")).unwrap();
    spec["exit_nonce"] = json!(nonce);
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "out\n", "nothing added to stdout");
    assert_eq!(
        out.stderr,
        format!("err\n\0sandgate-exit:{nonce}:3\n").into_bytes()
    );
    // The init's own failure after the spec was read still ends with the trailer.
    spec["argv"] = json!(["/nonexistent/program"]);
    let out = run(&spec.to_string());
    let code = out.status.code().unwrap();
    assert!(code >= 125, "{code}");
    assert!(
        out.stderr.starts_with(b"sandgate-init: "),
        "{}",
        text(&out.stderr)
    );
    assert!(
        out.stderr
            .ends_with(format!("\0sandgate-exit:{nonce}:{code}\n").as_bytes()),
        "{}",
        text(&out.stderr)
    );
    // A nonce that is not plain letters and digits is a spec error (and so no trailer).
    spec["exit_nonce"] = json!("short");
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(125));
    assert!(!out.stderr.contains(&0), "{}", text(&out.stderr));
}

#[test]
fn writes_files_with_their_mode_and_runs_relative_programs_in_cwd() {
    let dir = tmp();
    let tool = dir.path().join("bin/tool");
    let spec = json!({
        "argv": ["./bin/tool", "arg one"],
        "cwd": dir.path(),
        "files": [{
            "path": tool,
            "content_b64": base64::engine::general_purpose::STANDARD.encode("#!/bin/sh\necho \"$1\"\n"),
            "mode": 0o755,
        }],
    });
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "arg one\n");
}

#[test]
fn a_missing_program_is_127() {
    let out = run(r#"{"argv":["sandgate-no-such-command"],"cwd":"/tmp"}"#);
    assert_eq!(out.status.code(), Some(127));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("sandgate-init: cannot run \"sandgate-no-such-command\": "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1);
    assert!(out.stdout.is_empty());
}

#[test]
fn a_file_without_execute_permission_is_126() {
    let dir = tmp();
    let path = dir.path().join("not-executable");
    let spec = json!({
        "argv": [path],
        "cwd": "/tmp",
        "files": [{"path": path, "content_b64": "ZWNobyBoaQo="}],
    });
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
}

#[test]
fn bad_specs_are_125_with_one_line() {
    let dir = tmp();
    let outside = json!({"argv": ["true"], "files": [{"path": "/etc/passwd", "content_b64": ""}]});
    let escape = json!({"argv": ["true"], "files": [{"path": "/tmp/../etc/x", "content_b64": ""}]});
    let missing_cwd = json!({"argv": ["true"], "cwd": dir.path().join("absent")});
    for spec in [
        String::new(),
        "not json".into(),
        r#"{"argv":["true"],"unknown":1}"#.into(),
        r#"{"argv":[]}"#.into(),
        outside.to_string(),
        escape.to_string(),
        missing_cwd.to_string(),
    ] {
        let out = run(&spec);
        assert_eq!(
            out.status.code(),
            Some(125),
            "{spec}: {}",
            text(&out.stderr)
        );
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("sandgate-init: "), "{spec}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{spec}: {stderr}");
    }
}

#[test]
fn an_existing_file_is_not_overwritten() {
    let dir = tmp();
    let path = dir.path().join("f");
    std::fs::write(&path, "keep").unwrap();
    let spec =
        json!({"argv": ["true"], "cwd": "/tmp", "files": [{"path": path, "content_b64": ""}]});
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep");
}

#[test]
fn a_signal_death_is_128_plus_the_signal() {
    let dir = tmp();
    let out = run(&script_spec(dir.path(), "kill -9 $$"));
    assert_eq!(out.status.code(), Some(137));
    let dir = tmp();
    let out = run(&script_spec(dir.path(), "kill -TERM $$"));
    assert_eq!(out.status.code(), Some(143));
}

#[test]
fn background_processes_do_not_outlive_the_program() {
    let dir = tmp();
    let started = Instant::now();
    // The sleeps hold stdout open: the pipe closes only if they are killed.
    let out = run(&script_spec(
        dir.path(),
        "sleep 30 & (sleep 30 &); echo started; exit 0",
    ));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "started\n");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn orphans_are_reaped() {
    let dir = tmp();
    // The inner sleep is orphaned when its subshell exits and re-parented to the init, whose
    // pid is the script's $PPID. Afterwards no child of the init may be a zombie.
    let script = r#"(sleep 0.2 &)
sleep 1
for f in /proc/[0-9]*/stat; do
  read -r pid comm state ppid rest < "$f" 2>/dev/null || continue
  [ "$ppid" = "$PPID" ] && echo "$comm $state"
done
exit 0"#;
    let out = run(&script_spec(dir.path(), script));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let children = text(&out.stdout);
    assert!(children.contains("(sh)"), "{children}");
    assert!(!children.contains(" Z"), "zombie left: {children}");
}

#[test]
fn sigterm_is_forwarded_to_the_program() {
    let dir = tmp();
    let mut init = start(&script_spec(
        dir.path(),
        "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.1; done",
    ));
    let mut stdout = BufReader::new(init.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = Pid::from_raw(i32::try_from(init.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = init.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "got TERM\n");
    assert_eq!(status.code(), Some(42));
}

/// The design rests on this: signals blocked in the init are not blocked in the program, and
/// SIGPIPE (ignored by the Rust runtime) is back to its default. The program checked here is
/// the direct child (`grep`), not a shell, which would reset its own mask.
#[test]
fn the_program_starts_with_a_clean_signal_state_in_its_own_group() {
    let spec = json!({
        "argv": ["grep", "-E", "^(Sig(Blk|Ign)|NSpgid|Pid|NSpid):", "/proc/self/status"],
        "cwd": "/tmp",
    });
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status = text(&out.stdout);
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} missing: {status}"))
            .to_owned()
    };
    assert_eq!(field("SigBlk:"), "0000000000000000", "{status}");
    let ignored = u64::from_str_radix(&field("SigIgn:"), 16).unwrap();
    assert_eq!(ignored & (1 << (13 - 1)), 0, "SIGPIPE ignored: {status}");
    assert_eq!(
        field("NSpgid:"),
        field("Pid:"),
        "not its own group: {status}"
    );
}

#[test]
fn a_signal_before_the_exec_is_not_lost() {
    // SIGTERM right after start: whether it lands on the trampoline or the program, the
    // program's group must die of it (or the trap must run), never hang.
    let dir = tmp();
    let mut init = start(&script_spec(dir.path(), "sleep 30"));
    let pid = Pid::from_raw(i32::try_from(init.id()).unwrap());
    std::thread::sleep(Duration::from_millis(5));
    kill(pid, Signal::SIGTERM).unwrap();
    let started = Instant::now();
    let status = init.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    // 143 if the signal reached sh or the trampoline; 125 only if the init itself failed.
    assert_eq!(status.code(), Some(143));
}

#[test]
fn a_signal_while_the_spec_is_read_reaches_the_program() {
    let dir = tmp();
    let mut init = spawn_init();
    std::thread::sleep(Duration::from_millis(200));
    let pid = Pid::from_raw(i32::try_from(init.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    send_spec(&mut init, &script_spec(dir.path(), "sleep 30"));
    let started = Instant::now();
    let status = init.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code(), Some(143));
}

#[test]
fn env_replaces_the_whole_environment_and_drives_the_path_lookup() {
    let spec = json!({
        "argv": ["env"],
        "cwd": "/tmp",
        "env": {"PATH": "/usr/bin:/bin", "ONLY": "1"},
    });
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    assert_eq!(lines, ["ONLY=1", "PATH=/usr/bin:/bin"]);

    let spec = json!({"argv": ["sh", "-c", "true"], "cwd": "/tmp", "env": {"PATH": "/nowhere"}});
    assert_eq!(run(&spec.to_string()).status.code(), Some(127));
}
