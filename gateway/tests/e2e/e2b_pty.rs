//! E2B's PTY (`sbx.pty`: `process.Process/Start` with `pty`, `Update`, `SendInput` with `pty`
//! bytes, `SendSignal`) driven by E2B's own Python SDK through the real stack (dockerd, runsc,
//! PostgreSQL): a terminal of the asked size that is the shell's controlling terminal, resized,
//! typed into (an interactive bash, a `read` prompt, `^C` interrupting `sleep`), killed; the
//! start decided as `pty.create` and recorded with what the terminal showed.

use crate::common;

use common::TestGateway;

/// What an agent platform's terminal does, with E2B's SDK. Prints one JSON line.
const AGENT: &str = r#"
import json, threading, time
from e2b import Sandbox, PtySize, CommandExitException

out = {}
sbx = Sandbox.create(template="base", timeout=180)
out["id"] = sbx.sandbox_id
shown = bytearray()
lock = threading.Lock()

def on_pty(data):
    with lock:
        shown.extend(data)

def text():
    with lock:
        return shown.decode("utf-8", "replace")

def until(marker, within=15):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if marker in text():
            return True
        time.sleep(0.05)
    return False

def typed(line):
    sbx.pty.send_stdin(handle.pid, line.encode())

handle = sbx.pty.create(PtySize(rows=24, cols=80), cwd="/home/user")
ended = {}
def waiter():
    try:
        ended["result"] = handle.wait(on_pty=on_pty).exit_code
    except CommandExitException as e:
        ended["result"] = e.exit_code
    except Exception as e:
        ended["result"] = type(e).__name__ + ": " + str(e)
thread = threading.Thread(target=waiter)
thread.start()

# The markers are computed by the shell, so the terminal's echo of what was typed never
# matches them.
typed("tty; stty size; echo $TERM; echo M1-$((1+1))\n")
out["m1"] = until("M1-2")
out["first"] = text()
sbx.pty.resize(handle.pid, PtySize(rows=40, cols=120))
typed("stty size; echo M2-$((2+2))\n")
out["m2"] = until("M2-4")
out["resized"] = text()[len(out["first"]):]

typed('read -p "name? " NAME; echo "hello-$NAME-$((3+3))"\n')
out["prompted"] = until("name? ")
typed("sandgate\n")
out["m3"] = until("hello-sandgate-6")

typed("sleep 100; echo after-sleep-$((4+4))\n")
time.sleep(1.5)
began = time.monotonic()
typed("\x03")
typed("echo interrupted-$((5+5))\n")
out["interrupted"] = until("interrupted-10", within=20)
out["interrupt_s"] = time.monotonic() - began
out["after_sleep"] = "after-sleep-8" in text()

out["listed"] = [[p.pid == handle.pid, p.cmd, p.args] for p in sbx.commands.list()]
out["killed"] = sbx.pty.kill(handle.pid)
thread.join(20)
out["end"] = ended.get("result")

# A process without a terminal cannot be resized, nor sent `pty` input.
bg = sbx.commands.run("sleep 30", background=True)
for name, call in [("resize_plain", lambda: sbx.pty.resize(bg.pid, PtySize(rows=5, cols=5))),
                   ("pty_input_plain", lambda: sbx.pty.send_stdin(bg.pid, b"x"))]:
    try:
        call()
        out[name] = "accepted"
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
sbx.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_pty_is_a_terminal_that_is_resized_typed_into_interrupted_and_recorded() {
    common::require_docker();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), |config| {
        config.max_sessions = 2;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let said = common::e2b_agent(AGENT, &gw.url, &agent, &[]).await;
    let id = said["id"].as_str().unwrap().to_owned();

    assert_eq!(said["m1"], true, "{said}");
    let first = said["first"].as_str().unwrap();
    assert!(
        regex_like_pts(first),
        "tty names the terminal, not `not a tty`: {first}"
    );
    assert!(
        first.contains("24 80"),
        "stty size is the asked one: {first}"
    );
    assert!(first.contains("xterm-256color"), "{first}");
    assert_eq!(said["m2"], true, "{said}");
    let resized = said["resized"].as_str().unwrap();
    assert!(
        resized.contains("40 120"),
        "the resize reached it: {resized}"
    );
    assert_eq!(said["prompted"], true, "read's prompt is shown: {said}");
    assert_eq!(said["m3"], true, "the answer typed reached read: {said}");
    assert_eq!(said["interrupted"], true, "{said}");
    assert!(
        said["interrupt_s"].as_f64().unwrap() < 20.0,
        "^C ended sleep 100: {said}"
    );
    assert_eq!(
        said["after_sleep"], false,
        "^C abandoned the rest of the line"
    );
    assert_eq!(
        said["listed"],
        serde_json::json!([[true, "/bin/bash", ["-i", "-l"]]]),
        "the terminal's shell is listed"
    );
    assert_eq!(said["killed"], true);
    assert_eq!(said["end"], -1, "a killed terminal ends without a code");
    for name in ["resize_plain", "pty_input_plain"] {
        let refused = said[name].as_str().unwrap();
        assert!(refused.contains("no PTY"), "{name}: {refused}");
    }

    let pool = gw.pool().await;
    for _ in 0..100 {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM executions WHERE session_id = $1 AND finished_at IS NULL",
        )
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
        if running == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, code_sha256, stdout): (String, String, Option<Vec<u8>>) = sqlx::query_as(
        "SELECT e.status, e.code_sha256, e.stdout FROM executions e JOIN audit_events a \
         ON a.execution_id = e.id AND a.kind = 'execution.decision' \
         WHERE e.session_id = $1 AND a.input -> 'request' -> 'e2b' ->> 'call' = 'pty.create'",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(status, "killed");
    // The record's code: the SDK's program and arguments, its cwd, its envs' names only.
    let shown = "cd -- '/home/user'\n# envs: LANG LC_ALL TERM\n'/bin/bash' '-i' '-l'\n";
    use sha2::Digest as _;
    assert_eq!(code_sha256, hex::encode(sha2::Sha256::digest(shown)));
    let stdout = String::from_utf8_lossy(stdout.as_deref().unwrap_or_default()).into_owned();
    for seen in ["24 80", "40 120", "hello-sandgate-6", "interrupted-10"] {
        assert!(
            stdout.contains(seen),
            "the record keeps what the terminal showed: {seen} in {stdout}"
        );
    }
    pool.close().await;
    gw.stop().await;
}

/// Whether `shown` holds `/dev/pts/<n>` (what `tty` prints on a terminal; bash's own escape
/// sequences may come before it on the line).
fn regex_like_pts(shown: &str) -> bool {
    shown.match_indices("/dev/pts/").any(|(at, found)| {
        shown[at + found.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}
