//! Nothing a program writes is lost silently (issue 21, item 1), through the real stack: every
//! byte up to `output_bytes` is kept, beyond it the stream is marked truncated. Inside gVisor a
//! write to the container's own stdout could return a short count (65,536 of 300,000 bytes),
//! which unbuffered CPython does not retry: `print("a" * 200000)` was stored as 65,537
//! characters with `status: succeeded`. Runs cold, and warm with `SANDGATE_TEST_START=warm`;
//! the session cases run in a session sandbox either way.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use base64::Engine as _;
use serde_json::{json, Value};

use common::TestGateway;

/// acme's `output_bytes`.
const CAP: usize = 1 << 20;

/// A stream's exact bytes in a record (`<stream>_base64` is there only when they are not
/// UTF-8).
fn decoded(record: &Value, stream: &str) -> Vec<u8> {
    match record[format!("{stream}_base64")].as_str() {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
        None => record[stream]
            .as_str()
            .unwrap_or_else(|| panic!("no {stream}"))
            .as_bytes()
            .to_vec(),
    }
}

/// The stored record of an answer.
async fn stored(gw: &TestGateway, key: &str, answer: &Value) -> Value {
    let id = answer["id"].as_str().unwrap_or_else(|| panic!("{answer}"));
    let (status, record) = gw.get(key, &format!("/v1/executions/{id}")).await;
    assert_eq!(status, 200, "{record}");
    record
}

/// Says where two byte strings first differ, instead of printing megabytes.
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: got {} bytes, want {}, first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
}

/// Large single writes on both streams, by `print`, `sys.stdout.write` and `os.write`.
const LARGE_WRITES: &str = r#"
import os, sys
print("a" * 200000)
sys.stdout.write("b" * 300000)
sys.stdout.flush()
data = b"c" * 250000
while data:
    data = data[os.write(1, data):]
sys.stderr.write("e" * 300000)
sys.stderr.flush()
"#;

fn large_writes_stdout() -> Vec<u8> {
    let mut want = vec![b'a'; 200_000];
    want.push(b'\n');
    want.extend(vec![b'b'; 300_000]);
    want.extend(vec![b'c'; 250_000]);
    want
}

#[tokio::test(flavor = "multi_thread")]
async fn large_single_writes_are_kept_whole_on_both_streams() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, answer) = gw.execute(&key, "python", LARGE_WRITES, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let record = stored(&gw, &key, &answer).await;
    assert_eq!(record["status"], "succeeded", "{}", record["stderr"]);
    same(
        &decoded(&record, "stdout"),
        &large_writes_stdout(),
        "stdout",
    );
    same(&decoded(&record, "stderr"), &[b'e'; 300_000], "stderr");
    assert_eq!(record["stdout_truncated"], false);
    assert_eq!(record["stderr_truncated"], false);
    // The answer the caller waited for says the same.
    assert_eq!(answer["stdout"].as_str().unwrap().len(), 750_001);
}

/// Many writes, binary (every byte value, NULs included), interleaved on both streams, and a
/// `python3` started from bash.
#[tokio::test(flavor = "multi_thread")]
async fn many_binary_writes_and_python_under_bash_are_kept() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let program = r#"
import sys
chunk = bytes(range(256)) * 40
for i in range(60):
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(chunk[::-1])
    sys.stderr.buffer.flush()
"#;
    let (status, answer) = gw.execute(&key, "python", program, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let record = stored(&gw, &key, &answer).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    let chunk: Vec<u8> = (0..=255u8).collect::<Vec<_>>().repeat(40);
    let reversed: Vec<u8> = chunk.iter().rev().copied().collect();
    same(&decoded(&record, "stdout"), &chunk.repeat(60), "stdout");
    same(&decoded(&record, "stderr"), &reversed.repeat(60), "stderr");

    let bash = "python3 -c 'print(\"a\" * 200000)'\nprintf 'x%.0s' $(seq 1 1000)\n";
    let (status, answer) = gw.execute(&key, "bash", bash, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let record = stored(&gw, &key, &answer).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    let mut want = vec![b'a'; 200_000];
    want.push(b'\n');
    want.extend(vec![b'x'; 1000]);
    same(&decoded(&record, "stdout"), &want, "stdout");
}

/// Beyond `output_bytes`: exactly the cap is kept and the stream says it was cut.
#[tokio::test(flavor = "multi_thread")]
async fn beyond_the_cap_the_stream_is_marked_truncated() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let program = "import sys\nsys.stdout.write('%07d\\n' % 0 + 'y' * 1500000)\nprint('err', file=sys.stderr)\n";
    let (status, answer) = gw.execute(&key, "python", program, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let record = stored(&gw, &key, &answer).await;
    let stdout = decoded(&record, "stdout");
    assert_eq!(stdout.len(), CAP, "{}", record["stderr"]);
    assert!(stdout.starts_with(b"0000000\nyyy"));
    assert_eq!(record["stdout_truncated"], true);
    assert_eq!(record["stderr"], "err\n");
    assert_eq!(record["stderr_truncated"], false);
}

/// In a session, python and bash: each turn keeps all its output, and the next turn's is its
/// own.
#[tokio::test(flavor = "multi_thread")]
async fn session_turns_keep_every_byte() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(&key, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let path = format!(
        "/v1/sessions/{}/executions",
        session["id"].as_str().unwrap()
    );
    let (status, turn) = gw.post(&key, &path, &json!({"code": LARGE_WRITES})).await;
    assert_eq!(status, 200, "{turn}");
    let record = stored(&gw, &key, &turn).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    same(
        &decoded(&record, "stdout"),
        &large_writes_stdout(),
        "stdout",
    );
    same(&decoded(&record, "stderr"), &[b'e'; 300_000], "stderr");
    let (_, next) = gw
        .post(&key, &path, &json!({"code": "print('next')\n6 * 7"}))
        .await;
    assert_eq!(
        (next["stdout"].as_str(), next["result"].as_str()),
        (Some("next\n"), Some("42")),
        "{next}"
    );

    let (status, session) = gw
        .post(&key, "/v1/sessions", &json!({"language": "bash"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let path = format!(
        "/v1/sessions/{}/executions",
        session["id"].as_str().unwrap()
    );
    let code = "python3 -c 'import sys; sys.stdout.write(\"a\" * 300000); sys.stderr.write(\"e\" * 200000)'";
    let (status, turn) = gw.post(&key, &path, &json!({"code": code})).await;
    assert_eq!(status, 200, "{turn}");
    let record = stored(&gw, &key, &turn).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    same(&decoded(&record, "stdout"), &[b'a'; 300_000], "stdout");
    same(&decoded(&record, "stderr"), &[b'e'; 200_000], "stderr");
}
