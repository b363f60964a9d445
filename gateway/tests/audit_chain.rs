//! The audit trail as evidence: appends are refused any change, and tampering that bypasses the
//! triggers (a superuser) is found by verification.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use serde_json::json;

use common::TestGateway;

#[tokio::test(flavor = "multi_thread")]
async fn verify_passes_then_finds_the_tampered_event() {
    let gw = TestGateway::start().await;
    let auditor = gw.key("auditor", "audit").await;
    let agent = gw.key("agent", "acme").await;
    let (status, _) = gw.execute(&agent, "bash", "true", json!({})).await;
    assert_eq!(status, 200);
    let (status, denied) = gw.execute(&agent, "cobol", "x", json!({})).await;
    assert_eq!(status, 403);
    let denied_id = denied["error"]["execution_id"].as_str().unwrap().to_owned();
    let (status, _) = gw.execute("sgk_bogus", "bash", "true", json!({})).await;
    assert_eq!(status, 401);

    let (status, report) = gw.get(&auditor, "/v1/audit/verify").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["broken"], json!(null), "{report}");
    assert!(report["events"].as_i64().unwrap() >= 3, "{report}");
    assert_eq!(report["head"].as_str().unwrap().len(), 64);
    let (status, _) = gw.get(&agent, "/v1/audit/verify").await;
    assert_eq!(status, 403, "agents may not read the audit trail");

    // The application cannot change or remove an event.
    let pool = gw.pool().await;
    for statement in [
        "UPDATE audit_events SET allow = true WHERE execution_id = $1",
        "DELETE FROM audit_events WHERE execution_id = $1",
    ] {
        let refused = sqlx::query(statement).bind(&denied_id).execute(&pool).await;
        let err = refused.expect_err(statement).to_string();
        assert!(err.contains("append-only"), "{statement}: {err}");
    }
    let truncate = sqlx::query("TRUNCATE audit_events").execute(&pool).await;
    assert!(truncate.is_err(), "TRUNCATE must be refused");

    // A superuser can switch the trigger off: turn the deny into an allow, switch it back on.
    let seq: i64 = sqlx::query_scalar(
        "SELECT seq FROM audit_events WHERE execution_id = $1 AND kind = 'execution.decision'",
    )
    .bind(&denied_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(&format!(
        "ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update; \
         UPDATE audit_events SET allow = true, \
           decision = jsonb_set(decision, '{{allow}}', 'true') WHERE seq = {seq}; \
         ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update;"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let (status, report) = gw.get(&auditor, "/v1/audit/verify").await;
    assert_eq!(status, 200);
    assert_eq!(report["broken"]["seq"], seq, "{report}");
    assert!(
        report["broken"]["problem"]
            .as_str()
            .unwrap()
            .contains("modified"),
        "{report}"
    );

    // The command line says the same, and exits 1.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["audit", "verify"])
        .env("SANDGATE_DATABASE_URL", gw.database_url.as_deref().unwrap())
        .env("SANDGATE_DATA_DIR", gw.data_dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("broken at event {seq}")),
        "{stdout}"
    );
    gw.stop().await;
}
