//! A cell cannot forge a later cell's record through the session runner's channel (issue 21,
//! item 4, second half), through the real stack. The resident Python runner used to read each
//! turn (with its secret nonce) through `json.loads` in the program's own interpreter, and
//! print the end marker itself: a cell that replaced `json.loads` read the next turn's nonce
//! and ended that turn with a result of its choosing, and a bash cell that defined a `printf`
//! function got the nonce as an argument. Now sandbox-init writes every end marker, with a
//! nonce the runner never sees, on the runner's keyed report over a socket only the runner
//! and the init hold.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use serde_json::{json, Value};

use common::TestGateway;

async fn open(gw: &TestGateway, key: &str, language: &str) -> String {
    let (status, session) = gw
        .post(key, "/v1/sessions", &json!({"language": language}))
        .await;
    assert_eq!(status, 201, "{session}");
    format!(
        "/v1/sessions/{}/executions",
        session["id"].as_str().unwrap()
    )
}

async fn cell(gw: &TestGateway, key: &str, path: &str, code: &str) -> Value {
    let (status, turn) = gw.post(key, path, &json!({"code": code})).await;
    assert_eq!(status, 200, "{turn}");
    turn
}

/// Everything a cell can reach from Python without reading the runner's own frame: the
/// functions the runner used, `repr`, `base64`, `os.write`, every descriptor it holds, and
/// end markers printed with guessed nonces.
const HIJACK: &str = r#"
import base64, builtins, json, os, sys, threading, time

FORGED = base64.b64encode(b"'forged'").decode()
real_loads = json.loads

def forging_loads(text, *args, **kwargs):
    turn = real_loads(text, *args, **kwargs)
    if isinstance(turn, dict) and "nonce" in turn:
        marker = "\0sandgate-end:%s:0:%s\n" % (turn["nonce"], FORGED)
        for stream in (sys.__stdout__, sys.__stderr__):
            stream.write(marker)
            stream.flush()
    return turn

json.loads = forging_loads
builtins.repr = lambda value: "'forged'"
base64.b64encode = lambda data, *args: FORGED.encode()
real_write = os.write

def spray():
    report = ("\n%s:%d:0:%s\n" % ("0" * 32, 2, FORGED)).encode()
    for _ in range(100):
        for fd in range(3, 64):
            try:
                real_write(fd, report)
            except OSError:
                pass
        time.sleep(0.02)

threading.Thread(target=spray, daemon=True).start()
print("hijack installed")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_python_cell_cannot_forge_the_next_cells_record() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let path = open(&gw, &key, "python").await;

    let first = cell(&gw, &key, &path, HIJACK).await;
    assert_eq!(first["status"], "succeeded", "{first}");

    // The next cell's record is its own: what it printed, its result, its status.
    let second = cell(&gw, &key, &path, "print('second ran')\n6 * 7").await;
    assert_eq!(second["status"], "succeeded", "{second}");
    assert_eq!(second["result"], "42", "{second}");
    assert_eq!(second["stdout"], "second ran\n", "{second}");
    assert_eq!(second["exit_code"], 0, "{second}");

    let third = cell(&gw, &key, &path, "import sys\nprint('third')\nsys.exit(3)").await;
    assert_eq!(third["exit_code"], 3, "{third}");
    assert_eq!(third["stdout"], "third\n", "{third}");
    assert_ne!(third["status"], "succeeded", "{third}");

    // The stored record agrees with the answer.
    let id = second["id"].as_str().unwrap();
    let (_, stored) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(stored["result"], "42", "{stored}");
}

/// A bash cell that shadows `printf` (which the session's bash used to print the end markers
/// with the turn's nonce) changes nothing of the next cell's record.
#[tokio::test(flavor = "multi_thread")]
async fn a_bash_cell_cannot_forge_the_next_cells_record() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let path = open(&gw, &key, "bash").await;

    let shadow = r#"printf() { command printf '\0sandgate-end:%s:0:\n' "$2"; command printf '\0sandgate-end:%s:0:\n' "$2" >&2; }
echo shadowed"#;
    let first = cell(&gw, &key, &path, shadow).await;
    assert_eq!(first["status"], "succeeded", "{first}");

    let second = cell(&gw, &key, &path, "echo second ran; (exit 7)").await;
    assert_eq!(second["stdout"], "second ran\n", "{second}");
    assert_eq!(second["exit_code"], 7, "{second}");
    assert_ne!(second["status"], "succeeded", "{second}");
}
