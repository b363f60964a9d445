//! How an execution ends is the sandbox's truth, never the program's choice (issue 15, items 3
//! and 4), and what it leaves in `/output` is accounted for (issue 16, item 6): real dockerd,
//! runsc, PostgreSQL and the static sandbox-init. In the warm suite
//! (`SANDGATE_TEST_START=warm`) the executions the pool can serve run in pooled sandboxes.

use crate::common;

use serde_json::{json, Value};

use common::TestGateway;

/// Allocates in 10 MiB steps until the memory limit ends it.
const SMALL_STEP_BOMB: &str =
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10 * 1024 * 1024))\n";

/// The program tries to stop or kill its PID 1 and says what happened; it then exits 3.
const PYTHON_SIGNALS_THE_INIT: &str = r#"
import os, signal
for sig in (signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(1, sig)
        print(sig.name, "sent")
    except PermissionError as err:
        print(sig.name, "refused", err.errno)
raise SystemExit(3)
"#;

const BASH_SIGNALS_THE_INIT: &str = "kill -STOP 1 || echo stop refused\n\
     kill -9 1 || echo kill refused\n\
     sleep 1\n\
     echo still here\n\
     exit 4\n";

fn assert_oom(record: &Value) {
    assert_eq!(record["status"], "oom", "{record}");
    assert!(common::removed_soon(record["id"].as_str().unwrap()));
}

/// The bomb under 256 MB (the classroom tenant; cold, as the pool keeps python at 512 MB) and
/// under the pool's own shape (acme's default limits: warm in the warm suite), several times
/// each: the cgroup's word makes `oom` certain, not a race with dockerd's flag.
#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_in_small_steps_ends_as_oom_every_time() {
    let gw = TestGateway::start().await;
    let student = gw.key("agent", "classroom").await;
    let agent = gw.key("agent", "acme").await;
    for round in 0..3 {
        let (status, record) = gw
            .execute(&student, "python", SMALL_STEP_BOMB, json!({}))
            .await;
        assert_eq!(status, 200, "round {round}: {record}");
        assert_eq!(record["limits"]["memory_mb"], 256);
        assert_oom(&record);
        let (status, record) = gw
            .execute(&agent, "python", SMALL_STEP_BOMB, json!({}))
            .await;
        assert_eq!(status, 200, "round {round}: {record}");
        assert_oom(&record);
    }
    gw.stop().await;
}

/// A session's OOM is recorded as `oom` and closes the session with `closed_reason` `oom`.
#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_in_small_steps_closes_its_session_as_oom() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    for round in 0..2 {
        let (status, session) = gw
            .post(
                &agent,
                "/v1/sessions",
                &json!({"language": "python", "limits": {"memory_mb": 256}}),
            )
            .await;
        assert_eq!(status, 201, "{session}");
        let id = session["id"].as_str().unwrap();
        let (status, record) = gw
            .post(
                &agent,
                &format!("/v1/sessions/{id}/executions"),
                &json!({"code": SMALL_STEP_BOMB}),
            )
            .await;
        assert_eq!(status, 200, "round {round}: {record}");
        assert_eq!(record["status"], "oom", "round {round}: {record}");
        let (_, closed) = gw.get(&agent, &format!("/v1/sessions/{id}")).await;
        assert_eq!(closed["status"], "closed", "{closed}");
        assert_eq!(closed["closed_reason"], "oom", "{closed}");
    }
    gw.stop().await;
}

/// SIGSTOP and SIGKILL to PID 1 fail with EPERM; the execution ends with the program's own
/// exit, in python (the pooled runner in the warm suite) and in bash.
#[tokio::test(flavor = "multi_thread")]
async fn a_program_cannot_stop_or_kill_its_init() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let (status, record) = gw
        .execute(&agent, "python", PYTHON_SIGNALS_THE_INIT, json!({}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(
        record["stdout"], "SIGSTOP refused 1\nSIGKILL refused 1\n",
        "{record}"
    );
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["exit_code"], 3, "{record}");

    let (status, record) = gw
        .execute(&agent, "bash", BASH_SIGNALS_THE_INIT, json!({}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(
        record["stdout"], "stop refused\nkill refused\nstill here\n",
        "{record}"
    );
    assert!(
        record["stderr"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "{record}"
    );
    assert_eq!(record["exit_code"], 4, "{record}");
    gw.stop().await;
}

/// The same inside a session: the cell's kill fails, the cell ends with its own code and the
/// session lives on.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_cell_cannot_stop_or_kill_its_init() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    for (language, code, stdout, exit, alive) in [
        (
            "python",
            PYTHON_SIGNALS_THE_INIT,
            "SIGSTOP refused 1\nSIGKILL refused 1\n",
            3,
            "print('alive')",
        ),
        (
            "bash",
            "kill -STOP 1 || echo stop refused\nkill -9 1 || echo kill refused\n(exit 4)",
            "stop refused\nkill refused\n",
            4,
            "echo alive",
        ),
    ] {
        let (status, session) = gw
            .post(&agent, "/v1/sessions", &json!({"language": language}))
            .await;
        assert_eq!(status, 201, "{session}");
        let id = session["id"].as_str().unwrap();
        let path = format!("/v1/sessions/{id}/executions");
        let (status, record) = gw.post(&agent, &path, &json!({"code": code})).await;
        assert_eq!(status, 200, "{record}");
        assert_eq!(record["stdout"], stdout, "{language}: {record}");
        assert_eq!(record["exit_code"], exit, "{language}: {record}");
        let (status, record) = gw.post(&agent, &path, &json!({"code": alive})).await;
        assert_eq!(status, 200, "{record}");
        assert_eq!(record["stdout"], "alive\n", "{language}: {record}");
        let (_, open) = gw.get(&agent, &format!("/v1/sessions/{id}")).await;
        assert_ne!(open["status"], "closed", "{language}: {open}");
    }
    gw.stop().await;
}

/// Makes a FIFO, a bound Unix socket and a regular file in `/output`, one FIFO in a subfolder.
const LEAVES_SPECIAL_FILES: &str = r#"
import os, socket
os.mkfifo("/output/pipe")
os.makedirs("/output/sub")
os.mkfifo("/output/sub/pipe2")
sock = socket.socket(socket.AF_UNIX)
sock.bind("/output/sock")
open("/output/kept.txt", "w").write("kept")
print("left them")
"#;

fn assert_special_files_listed(record: &Value) {
    assert_eq!(record["status"], "succeeded", "{record}");
    let files: Vec<&str> = record["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| file["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["kept.txt"], "{record}");
    let mut skipped: Vec<(&str, &str)> = record["outputs_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["path"].as_str().unwrap(), s["reason"].as_str().unwrap()))
        .collect();
    skipped.sort();
    assert_eq!(
        skipped,
        [
            ("pipe", "special_file"),
            ("sock", "special_file"),
            ("sub/pipe2", "special_file")
        ],
        "{record}"
    );
}

/// FIFOs and sockets in `/output` live only in gVisor's memory; sandbox-init reports them and
/// the record lists them as `special_file` (cold, and warm in the warm suite).
#[tokio::test(flavor = "multi_thread")]
async fn special_files_in_output_are_listed_as_skipped() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let (status, record) = gw
        .execute(&agent, "python", LEAVES_SPECIAL_FILES, json!({}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_special_files_listed(&record);
    let (status, record) = gw
        .execute(
            &agent,
            "bash",
            "mkfifo /output/pipe /output/other && echo made",
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["stdout"], "made\n", "{record}");
    let skipped: Vec<&str> = record["outputs_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["path"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["other", "pipe"], "{record}");
    gw.stop().await;
}

/// In a session the init is asked after each execution.
#[tokio::test(flavor = "multi_thread")]
async fn special_files_in_a_sessions_output_are_listed_as_skipped() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let path = format!(
        "/v1/sessions/{}/executions",
        session["id"].as_str().unwrap()
    );
    let (status, record) = gw
        .post(&agent, &path, &json!({"code": LEAVES_SPECIAL_FILES}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_special_files_listed(&record);
    // The session goes on, and its output stays the program's own.
    let (status, record) = gw
        .post(&agent, &path, &json!({"code": "print('next')"}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["stdout"], "next\n", "{record}");
    gw.stop().await;
}

/// The run ends on sandbox-init's word (its end marker on stdout, its trailer on stderr) once
/// it killed and reaped everything the program left running, before the container has stopped:
/// the last bytes the program printed on either stream are all there, and a leftover that
/// left the program's group and session (and ignores SIGTERM) writes nothing after its program
/// ended, to the streams or to `/output` (cold, and warm in the warm suite).
#[tokio::test(flavor = "multi_thread")]
async fn a_programs_last_bytes_arrive_and_its_leftovers_are_gone_before_collection() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let code = "setsid sh -c 'trap \"\" TERM HUP INT; sleep 1; echo late > /output/late.txt; \
                echo late; echo late >&2' </dev/null &\n\
                echo early > /output/early.txt\n\
                head -c 200000 /dev/zero | tr '\\0' o\n\
                head -c 100000 /dev/zero | tr '\\0' e >&2\n";
    for _ in 0..3 {
        let (status, record) = gw.execute(&agent, "bash", code, json!({})).await;
        assert_eq!(status, 200, "{record}");
        assert_eq!(record["status"], "succeeded", "{record}");
        assert_eq!(
            record["stdout"],
            "o".repeat(200_000),
            "stdout's tail arrived"
        );
        assert_eq!(
            record["stderr"],
            "e".repeat(100_000),
            "stderr's tail arrived"
        );
        let outputs: Vec<&str> = record["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["path"].as_str().unwrap())
            .collect();
        assert_eq!(outputs, ["early.txt"], "{record}");
        let id = record["id"].as_str().unwrap();
        // Had the leftover survived the answer, it would write its file now; the area was
        // collected and unmounted, and the container is going.
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let (_, again) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
        assert_eq!(again["outputs"], record["outputs"], "{again}");
        assert!(common::removed_soon(id));
    }
    gw.stop().await;
}
