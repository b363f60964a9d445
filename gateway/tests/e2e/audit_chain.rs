//! The audit trail as evidence: the gateway's database role may only read and append
//! (`sandgate_app`), the triggers refuse changes even to the owner, tampering that bypasses both
//! (a superuser) is found by verification, and concurrent writers keep one gapless chain.

use crate::common;

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

/// The SQLSTATE of a refused statement.
fn sqlstate(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> String {
    let err = result.expect_err("the statement should have been refused");
    err.as_database_error()
        .and_then(|err| err.code())
        .map(|code| code.into_owned())
        .unwrap_or_else(|| panic!("not a database error: {err}"))
}

const PERMISSION_DENIED: &str = "42501";

#[tokio::test(flavor = "multi_thread")]
async fn the_gateways_database_role_cannot_change_the_audit_trail() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    // The gateway works as sandgate_app: an execution runs and is recorded.
    let (status, body) = gw.execute(&agent, "bash", "echo hi", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let id = body["id"].as_str().unwrap().to_owned();

    // A pool built exactly as the gateway builds its own.
    let options: sqlx::postgres::PgConnectOptions =
        gw.database_url.as_deref().unwrap().parse().unwrap();
    let app = gateway::database::pool(options).await.unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&app)
        .await
        .unwrap();
    assert_eq!(user, gateway::database::APP_ROLE);
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE execution_id = $1")
            .bind(&id)
            .fetch_one(&app)
            .await
            .unwrap();
    assert_eq!(recorded, 1, "the decision event is readable");
    for statement in [
        "UPDATE audit_events SET allow = false WHERE execution_id = $1",
        "DELETE FROM audit_events WHERE execution_id = $1",
    ] {
        let refused = sqlx::query(statement).bind(&id).execute(&app).await;
        assert_eq!(sqlstate(refused), PERMISSION_DENIED, "{statement}");
    }
    let refused = sqlx::query("TRUNCATE audit_events").execute(&app).await;
    assert_eq!(sqlstate(refused), PERMISSION_DENIED, "TRUNCATE");
    // Nor through a view (v_decisions cannot be written at all; the simple ones are read-only
    // for the role), nor by giving the role up for the session's default.
    let refused = sqlx::query("UPDATE v_decisions SET kind = 'x'")
        .execute(&app)
        .await;
    assert!(refused.is_err(), "UPDATE v_decisions");
    let refused = sqlx::query("UPDATE v_executions SET status = 'failed'")
        .execute(&app)
        .await;
    assert_eq!(sqlstate(refused), PERMISSION_DENIED, "UPDATE v_executions");
    let mut conn = app.acquire().await.unwrap();
    let refused = sqlx::raw_sql("RESET ROLE; DELETE FROM audit_events")
        .execute(&mut *conn)
        .await;
    assert_eq!(sqlstate(refused), PERMISSION_DENIED, "after RESET ROLE");
    // The pool logs in as sandgate_app itself (the embedded cluster trusts its socket), so not
    // even SET ROLE NONE reaches the owner's rights.
    let session: String = sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(session, gateway::database::APP_ROLE, "the pool's login");
    let refused = sqlx::raw_sql(
        "SET ROLE NONE; ALTER TABLE audit_events DISABLE TRIGGER ALL; DELETE FROM audit_events",
    )
    .execute(&mut *conn)
    .await;
    assert!(refused.is_err(), "SET ROLE NONE escaped to the owner");
    drop(conn);
    app.close().await;

    // The running gateway's own connections act as sandgate_app: take its INSERT away and it
    // cannot record a decision (503, fail closed); give it back and it can.
    let owner = gw.pool().await;
    sqlx::query("REVOKE INSERT ON audit_events FROM sandgate_app")
        .execute(&owner)
        .await
        .unwrap();
    let (status, body) = gw.execute(&agent, "cobol", "x", json!({})).await;
    sqlx::query("GRANT INSERT ON audit_events TO sandgate_app")
        .execute(&owner)
        .await
        .unwrap();
    assert_eq!(status, 503, "{body}");
    let (status, body) = gw.execute(&agent, "cobol", "x", json!({})).await;
    assert_eq!(status, 403, "{body}");
    owner.close().await;

    // sandgate_auditor reads the tables and views and changes nothing.
    let owner = gw.pool().await;
    let mut conn = owner.acquire().await.unwrap();
    sqlx::query("SET ROLE sandgate_auditor")
        .execute(&mut *conn)
        .await
        .unwrap();
    for query in [
        "SELECT count(*) FROM audit_events",
        "SELECT count(*) FROM executions",
        "SELECT count(*) FROM v_decisions",
        "SELECT count(*) FROM v_executions",
        "SELECT count(*) FROM v_approvals_waiting",
    ] {
        let rows: i64 = sqlx::query_scalar(query)
            .fetch_one(&mut *conn)
            .await
            .unwrap_or_else(|err| panic!("{query}: {err}"));
        assert!(rows >= 0);
    }
    for statement in [
        "UPDATE executions SET status = 'failed'",
        "INSERT INTO api_keys (id, key_hash, role, tenant) VALUES ('k', 'h', 'admin', 'x')",
        "DELETE FROM audit_events",
        // The stored payload of a pending request (code and files) is not for auditors.
        "SELECT request FROM approvals",
        // Nor is that of a session request relayed between replicas.
        "SELECT request FROM session_turns",
    ] {
        let refused = sqlx::query(statement).execute(&mut *conn).await;
        assert_eq!(sqlstate(refused), PERMISSION_DENIED, "auditor: {statement}");
    }
    sqlx::query("RESET ROLE").execute(&mut *conn).await.unwrap();
    drop(conn);
    owner.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_executions_leave_one_gapless_verified_chain() {
    const DENIED: usize = 200;
    const ALLOWED: usize = 4;
    let gw = std::sync::Arc::new(TestGateway::start().await);
    let agent = gw.key("agent", "acme").await;
    let auditor = gw.key("auditor", "audit").await;

    let mut requests = tokio::task::JoinSet::new();
    for n in 0..DENIED + ALLOWED {
        let gw = std::sync::Arc::clone(&gw);
        let agent = agent.clone();
        requests.spawn(async move {
            let body = if n < DENIED {
                // A language the policy refuses: recorded, nothing runs.
                json!({"language": "cobol", "code": format!("x{n}")})
            } else {
                json!({"language": "bash", "code": "true", "wait": false})
            };
            gw.post(&agent, "/v1/executions", &body).await
        });
    }
    let mut ids = std::collections::BTreeSet::new();
    let (mut denied, mut accepted) = (0, 0);
    while let Some(answer) = requests.join_next().await {
        let (status, body) = answer.unwrap();
        let id = match status {
            403 => {
                denied += 1;
                body["error"]["execution_id"].as_str()
            }
            202 => {
                accepted += 1;
                body["id"].as_str()
            }
            _ => panic!("unexpected answer {status}: {body}"),
        };
        assert!(ids.insert(id.unwrap().to_owned()), "duplicate id");
    }
    assert_eq!((denied, accepted), (DENIED, ALLOWED));

    let (status, report) = gw.get(&auditor, "/v1/audit/verify").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["broken"], json!(null), "{report}");
    // Two keys, then one decision per execution.
    let expected = (2 + DENIED + ALLOWED) as i64;
    assert_eq!(report["events"], expected, "{report}");

    let pool = gw.pool().await;
    let (count, distinct, first, last): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM audit_events",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (count, distinct, first, last),
        (expected, expected, 1, expected)
    );
    let decisions: Vec<String> = sqlx::query_scalar(
        "SELECT execution_id FROM audit_events WHERE kind = 'execution.decision'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let decided: std::collections::BTreeSet<String> = decisions.iter().cloned().collect();
    assert_eq!(
        decisions.len(),
        ids.len(),
        "one decision event per execution"
    );
    assert_eq!(decided, ids);
    pool.close().await;

    // The command line agrees.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["audit", "verify"])
        .env("SANDGATE_DATABASE_URL", gw.database_url.as_deref().unwrap())
        .env("SANDGATE_DATA_DIR", gw.data_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("ok {expected} events")),
        "{stdout}"
    );
    let gw = std::sync::Arc::into_inner(gw).expect("no request holds the gateway");
    gw.stop().await;
}
