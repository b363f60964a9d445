//! Refusals anyone can cause in bulk leave a bounded trail (issue 15, items 5 and 9): failed
//! authentications, upload-path traversal and cross-tenant probes are audited with bounded rows,
//! one event per window and source (or key) plus one summary with the count, and a flood gets
//! 429 with `retry-after`; a dry run's large input is stored as its hash.

use crate::common;

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::PgPool;

use common::{fresh_database, TestGateway};
use gateway::app::refusals::RefusalLimits;

const WINDOW_S: u64 = 5;

async fn gateway(per_source: u32, per_key: u32) -> TestGateway {
    let url = fresh_database().await;
    TestGateway::start_with(Some(url), move |config| {
        config.refusals = RefusalLimits {
            window_s: WINDOW_S,
            per_source,
            per_key,
        };
    })
    .await
}

/// (rows, largest row's input in bytes) of events whose kind starts with `kind`.
async fn rows_of(pool: &PgPool, kind: &str) -> Vec<(String, Value, Value)> {
    sqlx::query_as("SELECT kind, input, decision FROM audit_events WHERE kind LIKE $1 ORDER BY seq")
        .bind(format!("{kind}%"))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Waits until the window has ended in a summary row (`<kind>.repeated`) for each of `kinds`.
async fn summarised(pool: &PgPool, kinds: &[&str]) {
    let within = Duration::from_secs(WINDOW_S + 30);
    common::eventually(within, "the window's summaries are written", || async {
        for kind in kinds {
            let repeated = format!("{kind}.repeated");
            if !rows_of(pool, kind)
                .await
                .iter()
                .any(|row| row.0 == repeated)
            {
                return false;
            }
        }
        true
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_authentications_are_bounded_aggregated_and_throttled() {
    let gw = gateway(5, 1000).await;
    let pool = gw.pool().await;
    let long_path = format!("/v1/executions/{}", "a".repeat(60_000));
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..30 {
        let response = gw
            .http
            .get(format!("{}{long_path}", gw.url))
            .bearer_auth("sgk_0123456789abcdef_not-a-key")
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == 429 {
            retry_after = response.headers().get("retry-after").cloned();
        }
    }
    assert!(statuses[..5].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    let retry_after: u64 = retry_after.unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=WINDOW_S).contains(&retry_after), "{retry_after}");

    // One row for 30 failures, and it is small although the path was 60 KB.
    let rows = rows_of(&pool, "auth.failure").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let input = rows[0].1.to_string();
    assert!(input.len() < 1024, "{} bytes: {input}", input.len());
    assert_eq!(rows[0].1["request"]["path"]["bytes"], long_path.len());
    assert_eq!(rows[0].1["source"], "127.0.0.1");

    // A valid key from the same address is not throttled.
    let auditor = gw.key("auditor", "acme").await;
    let (status, body) = gw.get(&auditor, "/v1/executions").await;
    assert_eq!(status, 200, "{body}");

    // The window ends in one summary carrying the count.
    summarised(&pool, &["auth.failure"]).await;
    let rows = rows_of(&pool, "auth.failure").await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[1].0, "auth.failure.repeated");
    assert_eq!(rows[1].2["repeats"], 4, "{rows:?}");
    assert_eq!(rows[1].2["throttled"], 25, "{rows:?}");
    // A new window: 401 again, and a new first row.
    let response = gw
        .http
        .get(format!("{}/v1/executions", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(rows_of(&pool, "auth.failure").await.len(), 3);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_claimed_key_id_is_throttled_across_addresses() {
    let gw = gateway(1000, 3).await;
    let mut statuses = Vec::new();
    for attempt in 0..6 {
        // Same claimed id, different secrets.
        let secret = format!("sgk_00000000000000aa_guess{attempt}");
        let (status, _) = gw.get(&secret, "/v1/executions").await;
        statuses.push(status);
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429]);
    let rows = rows_of(&gw.pool().await, "auth.failure").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn traversal_and_cross_tenant_probes_are_audited_once_per_window_with_a_count() {
    let gw = gateway(1000, 1000).await;
    let pool = gw.pool().await;
    let agent = gw.key("agent", "acme").await;
    for name in ["../etc/passwd", "%2e%2e/x", "/abs"] {
        let files = json!({"files": [{"path": name, "content_b64": ""}]});
        let (status, body) = gw.execute(&agent, "python", "print(1)", files).await;
        assert_eq!(status, 400, "{body}");
    }
    let rows = rows_of(&pool, "request.traversal").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1["request"]["file"], "../etc/passwd");

    // Another tenant's execution (denied, so nothing runs): 404, like a missing id, audited.
    let other = gw.key("agent", "globex").await;
    let (status, body) = gw.execute(&other, "cobol", "x", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let id = body["error"]["execution_id"].as_str().unwrap().to_owned();
    for path in [
        format!("/v1/executions/{id}"),
        format!("/v1/executions/{id}/connections"),
    ] {
        let (status, body) = gw.get(&agent, &path).await;
        assert_eq!(status, 404, "{body}");
    }
    let (missing, _) = gw.get(&agent, "/v1/executions/ex_missing").await;
    assert_eq!(missing, 404);
    let rows = rows_of(&pool, "request.cross_tenant").await;
    assert_eq!(
        rows.len(),
        1,
        "only the other tenant's id is a probe: {rows:?}"
    );
    assert_eq!(rows[0].1["request"]["owner_tenant"], "globex");

    summarised(&pool, &["request.traversal", "request.cross_tenant"]).await;
    let traversal = rows_of(&pool, "request.traversal").await;
    assert_eq!(traversal.len(), 2, "{traversal:?}");
    assert_eq!(traversal[1].2["repeats"], 2);
    let probes = rows_of(&pool, "request.cross_tenant").await;
    assert_eq!(probes.len(), 2, "{probes:?}");
    assert_eq!(probes[1].2["repeats"], 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_runs_large_input_is_stored_as_its_hash() {
    let gw = TestGateway::start().await;
    let reviewer = gw.key("reviewer", "ops").await;
    let input = json!({
        "principal": {"key_id": "key_x", "tenant": "acme", "role": "agent"},
        "request": {"language": "python", "code_sha256": "0", "code_bytes": 1, "files": [],
                    "network": [], "mounts": [], "limits": {},
                    "labels": {"pad": "x".repeat(2 * 1024 * 1024)}},
        "environment": {"backends": ["gvisor"], "datasets": [], "now": "2026-12-01T00:00:00Z"}
    });
    let (status, body) = gw
        .post(&reviewer, "/v1/policy/evaluate", &json!({"input": input}))
        .await;
    assert_eq!(status, 200, "{body}");
    let rows = rows_of(&gw.pool().await, "policy.evaluate").await;
    assert_eq!(rows.len(), 1);
    let stored = rows[0].1.to_string();
    assert!(stored.len() < 1024, "{} bytes stored", stored.len());
    assert_eq!(rows[0].1["input"]["stored"], false);
    assert_eq!(
        rows[0].1["input"]["bytes"].as_u64().unwrap(),
        input.to_string().len() as u64
    );
    let (status, body) = gw
        .post(
            &reviewer,
            "/v1/policy/evaluate",
            &json!({"input": {"a": "b\u{0}"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_flooding_denied_egress_leaves_bounded_rows_and_an_exact_count() {
    let policies = common::egress::bundle_with_test_tenant(&[("echo.test", 80)]);
    let gw = common::egress::gateway_with(policies.path(), &[]).await;
    let key = gw.key("agent", "nettest").await;
    let code = r#"
import socket
refused = 0
for i in range(400):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT evil%d.test:443 HTTP/1.1\r\n\r\n" % i)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    refused += b"egress.too_many_denials" in data
print(refused)
"#;
    let network = json!({"network": [{"host": "echo.test", "port": 80}]});
    let (status, body) = gw.execute(&key, "python", code, network).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let refused: i64 = body["stdout"].as_str().unwrap().trim().parse().unwrap();
    let id = body["id"].as_str().unwrap();

    let pool = gw.pool().await;
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM egress_connections WHERE execution_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    let counted: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum((decision->>'count')::bigint), 0)::bigint FROM audit_events \
         WHERE execution_id = $1 AND kind = 'egress.denied.repeated'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        rows <= i64::from(egress_proxy::DEFAULT_MAX_DENIED),
        "{rows} rows"
    );
    assert!(
        refused > 0,
        "400 denials in a few seconds must pass the rate"
    );
    assert_eq!(counted, refused, "each refused attempt is counted");
    assert_eq!(rows + counted, 400, "every attempt is a row or a count");
    gw.stop().await;
}
