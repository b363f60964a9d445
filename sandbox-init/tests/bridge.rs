//! The proxy bridge of the real binary, on the host: the init listens on a free loopback port
//! (3128 may be taken here; inside the sandbox it is 3128) and relays to a Unix socket served
//! by the test. The programs are `python3` scripts. The same bridge runs inside gVisor in
//! `tests/runsc-smoke.sh`.

#![allow(
    clippy::unwrap_used,
    reason = "helpers of an integration test: a panic is a test failure"
)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const INIT: &str = env!("CARGO_BIN_EXE_sandbox-init");

/// The bridge's bound, as documented in `src/bridge.rs`.
const MAX_CONNECTIONS: usize = 256;

/// The real interpreter behind `python3` (not a version manager's shim, which needs its own
/// environment): the specs below replace the whole environment.
fn python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .unwrap_or_else(|err| panic!("these tests need python3 on the host: {err}"));
        assert!(out.status.success(), "python3 -c failed");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sandgate-bridge-")
        .tempdir_in("/tmp")
        .unwrap()
}

/// A spec running `script` with python3, its port as `sys.argv[1]`, `env` as its environment.
fn spec(script: &str, port: u16, socket: &Path, env: Value) -> String {
    json!({
        "argv": [python(), "-c", script, port.to_string()],
        "cwd": "/tmp",
        "env": env,
        "proxy": {"listen": format!("127.0.0.1:{port}"), "socket": socket},
    })
    .to_string()
}

fn run_with(mut command: Command, spec: &str) -> Output {
    let mut init = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = init.stdin.take().unwrap();
    stdin.write_all(spec.as_bytes()).unwrap();
    stdin.write_all(b"\n").unwrap();
    drop(stdin);
    init.wait_with_output().unwrap()
}

fn run(spec: &str) -> Output {
    run_with(Command::new(INIT), spec)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Serves `path`, one thread per connection running `handle`, until the test process ends.
fn serve(path: &Path, handle: fn(UnixStream)) {
    let listener = UnixListener::bind(path).unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let conn = conn.unwrap();
            thread::spawn(move || handle(conn));
        }
    });
}

/// Echoes what it reads as it reads it; on EOF shuts down its own write half.
fn echo(mut conn: UnixStream) {
    let mut buffer = [0; 4096];
    loop {
        match conn.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                if conn.write_all(&buffer[..read]).is_err() {
                    return;
                }
            }
        }
    }
    let _ = conn.shutdown(Shutdown::Write);
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("egress.sock")
}

#[test]
fn relays_to_the_unix_socket_both_ways_with_half_close() {
    let dir = tmp();
    let socket = socket_in(&dir);
    serve(&socket, echo);
    // Sends, half-closes, and reads until the echo server, seeing the EOF, closes its side.
    let script = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"hello " * 50000)
s.shutdown(socket.SHUT_WR)
data = b""
while chunk := s.recv(65536):
    data += chunk
print(len(data), data[:12])
"#;
    let out = run(&spec(script, free_port(), &socket, json!({})));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "300000 b'hello hello '\n");
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn the_standard_proxy_variable_reaches_the_socket_in_absolute_form() {
    let dir = tmp();
    let socket = socket_in(&dir);
    // Answers any request with its own request line.
    serve(&socket, |mut conn| {
        let mut head = Vec::new();
        let mut byte = [0; 1];
        while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let line = text(&head).lines().next().unwrap_or_default().to_owned();
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{line}",
            line.len()
        );
        conn.write_all(response.as_bytes()).unwrap();
    });
    let port = free_port();
    let script = r#"
import urllib.request
print(urllib.request.urlopen("http://example.invalid/path?q=1", timeout=10).read().decode())
"#;
    let env = json!({"HTTP_PROXY": format!("http://127.0.0.1:{port}")});
    let out = run(&spec(script, port, &socket, env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "GET http://example.invalid/path?q=1 HTTP/1.1\n"
    );
}

#[test]
fn a_missing_socket_closes_each_connection_and_is_reported_once() {
    let dir = tmp();
    let socket = dir.path().join("absent.sock");
    let script = r#"
import socket, sys
for _ in range(3):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.settimeout(10)
    try:
        s.sendall(b"GET http://example.com/ HTTP/1.1\r\n\r\n")
        print("closed" if s.recv(100) == b"" else "data")
    except (ConnectionResetError, BrokenPipeError):
        print("closed")
sys.exit(7)
"#;
    let out = run(&spec(script, free_port(), &socket, json!({})));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "closed\nclosed\nclosed\n");
    let stderr = text(&out.stderr);
    let expected = format!(
        "sandgate-init: proxy bridge: connecting to {}: No such file or directory",
        socket.display()
    );
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_listen_address_in_use_is_an_init_error() {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let spec = json!({
        "argv": ["echo", "ran"],
        "cwd": "/tmp",
        "proxy": {"listen": format!("127.0.0.1:{port}"), "socket": "/run/sandgate/egress.sock"},
    });
    let out = run(&spec.to_string());
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty(), "the program ran");
    let stderr = text(&out.stderr);
    let expected = format!("sandgate-init: proxy bridge: listening on 127.0.0.1:{port}: ");
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_bad_proxy_spec_is_an_init_error() {
    for (proxy, message) in [
        (
            json!({"listen": "0.0.0.0:3128", "socket": "/run/sandgate/egress.sock"}),
            "sandgate-init: proxy listen \"0.0.0.0:3128\": is not a loopback address\n",
        ),
        (
            json!({"listen": "127.0.0.1:3128", "socket": "egress.sock"}),
            "sandgate-init: proxy socket \"egress.sock\": is not absolute\n",
        ),
    ] {
        let spec = json!({"argv": ["echo", "ran"], "cwd": "/tmp", "proxy": proxy});
        let out = run(&spec.to_string());
        assert_eq!(out.status.code(), Some(125));
        assert!(out.stdout.is_empty());
        assert_eq!(text(&out.stderr), message);
    }
}

#[test]
fn stuck_relays_do_not_keep_the_init_alive() {
    let dir = tmp();
    let socket = socket_in(&dir);
    // Accepts and then neither reads, writes nor closes, for longer than the test.
    serve(&socket, |conn| {
        thread::sleep(Duration::from_secs(600));
        drop(conn);
    });
    // One relay blocked writing to the socket (its buffers full), one blocked reading it.
    let script = r#"
import socket, sys
port = int(sys.argv[1])
full = socket.create_connection(("127.0.0.1", port))
full.setblocking(False)
sent = 0
try:
    while sent < 64 << 20:
        sent += full.send(b"x" * 65536)
except BlockingIOError:
    pass
idle = socket.create_connection(("127.0.0.1", port))
idle.sendall(b"x")
print("sent", sent > 0)
sys.exit(5)
"#;
    let started = Instant::now();
    let out = run(&spec(script, free_port(), &socket, json!({})));
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "sent True\n");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn the_programs_last_bytes_reach_a_proxy_that_half_closed_first() {
    let dir = tmp();
    let socket = socket_in(&dir);
    let listener = UnixListener::bind(&socket).unwrap();
    let server = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"half").unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        // So that the program's FIN arrives before all its bytes are relayed.
        thread::sleep(Duration::from_millis(500));
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        got.len()
    });
    // Reads to the proxy's EOF, then sends and closes: the bytes come with the program's FIN.
    let script = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
got = b""
while chunk := s.recv(100):
    got += chunk
s.sendall(b"x" * 100000)
s.close()
print(got)
"#;
    let out = run(&spec(script, free_port(), &socket, json!({})));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "b'half'\n");
    assert_eq!(server.join().unwrap(), 100_000);
}

#[test]
fn a_relay_whose_proxy_hung_up_waits_without_spinning() {
    let dir = tmp();
    let socket = socket_in(&dir);
    // Answers and closes at once, while the program keeps its end open: the relay's Unix
    // socket has hung up (a level-triggered wait would report it on every call) and its TCP
    // socket stays idle.
    serve(&socket, |mut conn| conn.write_all(b"bye").unwrap());
    let script = r#"
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
data = b""
while chunk := s.recv(100):
    data += chunk
def cpu_of_init():
    fields = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
before = cpu_of_init()
time.sleep(1.5)
used = cpu_of_init() - before
print(data, "idle" if used < 0.3 else f"busy for {used}s")
"#;
    let out = run(&spec(script, free_port(), &socket, json!({})));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "b'bye' idle\n");
}

#[test]
fn connections_beyond_the_bound_are_closed_until_one_ends() {
    let dir = tmp();
    let socket = socket_in(&dir);
    serve(&socket, echo);
    // Holds MAX_CONNECTIONS relays open (each proven by an echo), sees the next one closed,
    // ends one and is let in again.
    let script = r#"
import socket, sys, time
port, bound = int(sys.argv[1]), int(sys.argv[2])
def dial():
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    return s
def echoed(s):
    try:
        s.sendall(b"y")
        return s.recv(1) == b"y"
    except (ConnectionResetError, BrokenPipeError):
        return False
held = [dial() for _ in range(bound)]
print("held", all(echoed(s) for s in held))
print("next", echoed(dial()))
held.pop().close()
for _ in range(200):
    if echoed(dial()):
        print("again True")
        break
    time.sleep(0.05)
"#;
    let port = free_port();
    let spec = json!({
        "argv": [python(), "-c", script, port.to_string(), MAX_CONNECTIONS.to_string()],
        "cwd": "/tmp",
        "proxy": {"listen": format!("127.0.0.1:{port}"), "socket": socket},
    });
    // The descriptor limit the gateway gives a sandbox: the bridge must fit within it.
    let mut command = Command::new("sh");
    command.args(["-c", "ulimit -n 1024 && exec \"$0\"", INIT]);
    let out = run_with(command, &spec.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "held True\nnext False\nagain True\n");
    assert_eq!(
        text(&out.stderr),
        format!(
            "sandgate-init: proxy bridge: {MAX_CONNECTIONS} connections open already; \
             closing new ones until some end\n"
        )
    );
}
