//! No lost or false records (issue 15, items 1 and 2), through the real stack: whatever bytes a
//! program writes, its record completes with exactly them; a NUL in what a client sends is a
//! clear 400; and a PostgreSQL outage in the middle of a run loses neither the run's outcome nor
//! its egress byte counts (the local journal keeps them and writes them back).

use crate::common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use sqlx::PgPool;

use common::egress::bundle_with_test_tenant;
use common::upstream::{echo_upstream, UPSTREAM};
use common::{test_config, TestGateway};
use gateway::database::EmbeddedPostgres;

/// Bytes no text column can hold: NUL, a lone continuation byte, an invalid start byte.
const PROGRAM: &str = r#"
import os, sys
sys.stdout.buffer.write(b"a\x00b\xff\xfe\n")
sys.stdout.flush()
sys.stderr.buffer.write(b"e\x00\x80\n")
sys.stderr.flush()
open(b"/output/bad\xffname", "wb").write(b"x")
open("/output/good.txt", "w").write("fine")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn nul_and_invalid_utf8_in_output_are_stored_exactly_and_the_run_completes() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, body) = gw.execute(&key, "python", PROGRAM, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let id = body["id"].as_str().unwrap().to_owned();

    // The stored record, not only the answer: completed, with the exact bytes.
    let (status, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["exit_code"], 0, "{record}");
    let b64 = base64::engine::general_purpose::STANDARD;
    let exact = |field: &str| b64.decode(record[field].as_str().unwrap()).unwrap();
    assert_eq!(exact("stdout_base64"), b"a\x00b\xff\xfe\n", "{record}");
    assert_eq!(exact("stderr_base64"), b"e\x00\x80\n", "{record}");
    assert_eq!(record["stdout"], "a\u{0}b\u{fffd}\u{fffd}\n", "{record}");
    let outputs = record["outputs"].to_string();
    assert!(outputs.contains("good.txt"), "{record}");
    let skipped = record["outputs_skipped"].as_array().unwrap();
    assert!(
        skipped.iter().any(|s| s["reason"] == "bad_name"),
        "{record}"
    );

    let pool = gw.pool().await;
    let (stdout, stderr): (Vec<u8>, Vec<u8>) =
        sqlx::query_as("SELECT stdout, stderr FROM executions WHERE id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stdout, b"a\x00b\xff\xfe\n");
    assert_eq!(stderr, b"e\x00\x80\n");
    assert_no_false_cause(&pool, &id).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nul_in_labels_ids_or_query_strings_is_a_clear_400() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let auditor = gw.key("auditor", "acme").await;
    let labels = json!({"labels": {"agent": "a\u{0}b"}});
    let (status, body) = gw.execute(&agent, "python", "print(1)", labels).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");

    for path in [
        "/v1/executions?tenant=a%00b",
        "/v1/executions?status=running%00",
        "/v1/executions/ex_%00",
        "/v1/executions/ex_%00/connections",
        "/v1/audit/events?kind=auth.failure%00",
        "/v1/approvals/ap_%00",
    ] {
        let (status, body) = gw.get(&auditor, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{path}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("NUL"),
            "{path}: {body}"
        );
    }
    // The store was never the problem: it still answers.
    let (status, _) = gw.get(&auditor, "/v1/executions?tenant=acme").await;
    assert_eq!(status, 200);
    gw.stop().await;
}

/// The program opens a tunnel (its row is committed), then waits while the test stops the
/// database, then sends ~40 KB through it and ends: both the close and the completion happen
/// while PostgreSQL is down.
fn outage_program(port: u16) -> String {
    format!(
        r#"
import json, socket, sys, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
s.sendall(b"CONNECT echo.test:{port} HTTP/1.1\r\nHost: echo.test:{port}\r\n\r\n")
answer = b""
while b"\r\n\r\n" not in answer:
    answer += s.recv(4096)
head, rest = answer.split(b"\r\n\r\n", 1)
assert head.startswith(b"HTTP/1.1 200"), head
time.sleep(8)
request = b"GET /outage HTTP/1.1\r\nHost: echo.test\r\nX-Pad: " + b"a" * 40000 + b"\r\nConnection: close\r\n\r\n"
s.sendall(request)
down = len(rest)
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    down += len(chunk)
print(json.dumps({{"up": len(request), "down": down}}))
sys.stdout.buffer.write(b"end\x00\n")
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_outage_mid_run_loses_neither_the_outcome_nor_the_byte_counts() {
    let upstream = echo_upstream();
    let policies = bundle_with_test_tenant(&[("echo.test", upstream.port)]);
    let dir = policies.path().to_owned();
    // The embedded default: the cluster lives under the gateway's data dir, so stopping it
    // touches no other test.
    let gw = TestGateway::start_with(None, move |config| {
        config.policy_dir = dir;
        config
            .egress_hosts
            .insert("echo.test".to_owned(), vec![UPSTREAM.parse().unwrap()]);
    })
    .await;
    let config = test_config(None, gw.data_dir.path());
    let key = gateway::cli::keys::create_key(&config, "agent", "nettest")
        .await
        .unwrap()
        .secret;
    let pg = EmbeddedPostgres::start(gw.data_dir.path(), None).unwrap();
    let pool = PgPool::connect_with(pg.connect_options("sandgate"))
        .await
        .unwrap();

    let run = {
        let (http, url) = (gw.http.clone(), gw.url.clone());
        let body = json!({"language": "python", "code": outage_program(upstream.port),
                          "network": [{"host": "echo.test", "port": upstream.port}], "wait": true});
        tokio::spawn(async move {
            let response = http
                .post(format!("{url}/v1/executions"))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        })
    };
    let (id, connection) = wait_for_open_connection(&pool).await;
    pool.close().await;
    pg.stop_now("immediate").unwrap();

    let (status, answer) = run.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "succeeded", "{answer}");
    assert_eq!(answer["id"], id.as_str());
    let first_line = answer["stdout"].as_str().unwrap().lines().next().unwrap();
    let sent: Value = serde_json::from_str(first_line).unwrap();
    assert!(sent["up"].as_i64().unwrap() > 40_000, "{sent}");
    let journal = gw.data_dir.path().join("journal");
    assert!(
        journal_files(&journal) >= 2,
        "the completion and the close should wait in the journal"
    );

    let pg = EmbeddedPostgres::start(gw.data_dir.path(), None).unwrap();
    let pool = PgPool::connect_with(pg.connect_options("sandgate"))
        .await
        .unwrap();
    let record = wait_until_finished(&pool, &id).await;
    assert_eq!(record.0, "succeeded", "{record:?}");
    assert_eq!(record.1, Some(0), "{record:?}");
    let expected = format!("{first_line}\nend\u{0}\n").into_bytes();
    assert_eq!(record.2, expected, "stdout stored exactly");

    let (closed, up, down): (bool, i64, i64) = sqlx::query_as(
        "SELECT closed_at IS NOT NULL, bytes_up, bytes_down FROM egress_connections WHERE id = $1",
    )
    .bind(&connection)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(closed, "the connection row was closed from the journal");
    assert_eq!(up, sent["up"].as_i64().unwrap(), "bytes up exact");
    assert_eq!(down, sent["down"].as_i64().unwrap(), "bytes down exact");
    assert_no_false_cause(&pool, &id).await;
    assert_eq!(
        journal_files(&journal),
        0,
        "the journal is empty once written back"
    );
    pool.close().await;
    gw.stop().await;
}

/// The execution and connection ids once the tunnel's row is committed.
async fn wait_for_open_connection(pool: &PgPool) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT execution_id, id FROM egress_connections WHERE allow AND closed_at IS NULL",
        )
        .fetch_optional(pool)
        .await
        .unwrap();
        if let Some(found) = row {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the tunnel was never recorded as open");
}

async fn wait_until_finished(pool: &PgPool, id: &str) -> (String, Option<i32>, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let row: Option<(String, Option<i32>, Option<Vec<u8>>)> = sqlx::query_as(
            "SELECT status, exit_code, stdout FROM executions \
             WHERE id = $1 AND finished_at IS NOT NULL",
        )
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap_or(None);
        if let Some((status, code, stdout)) = row {
            return (status, code, stdout.unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the execution's end was never written back");
}

/// Records stored under the journal directory (not counting `refused/`).
fn journal_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| {
            let path = entry.as_ref().unwrap().path();
            path.extension().is_some_and(|ext| ext == "json")
        })
        .count()
}

/// Nothing in the trail says the run was abandoned or reaped: that never happened.
async fn assert_no_false_cause(pool: &PgPool, id: &str) {
    let reaped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE execution_id = $1 AND kind = 'execution.reaped'",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(reaped, 0, "a cause that did not occur was recorded");
    let error: Option<String> = sqlx::query_scalar("SELECT error FROM executions WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(error, None);
}
