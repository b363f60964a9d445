//! The MCP server with the official MCP Python SDK as the client (`gateway/tests/mcp/`), over
//! stdio (`sandgate mcp`, this build's binary) and streamable HTTP (`POST /mcp`) against a live
//! gateway; then the audit store shows that every tool call was decided and recorded like any
//! execution (the malformed calls made none).

use crate::common;

use std::process::Command;

use common::{python_venv, workspace_root, TestGateway};

#[tokio::test(flavor = "multi_thread")]
async fn mcp_clients_run_code_through_policy_and_audit() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let classroom = gw.key("agent", "classroom").await;
    let tests = workspace_root().join("gateway/tests/mcp");
    let python = python_venv().join("bin/python");
    let url = gw.url.clone();
    let key = agent.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:asyncio",
                "test_mcp.py",
            ])
            .current_dir(&tests)
            .env("SANDGATE_URL", url)
            .env("SANDGATE_KEY", key)
            .env("SANDGATE_CLASSROOM_KEY", classroom)
            .env("SANDGATE_BIN", env!("CARGO_BIN_EXE_sandgate"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{said}");
    assert!(output.status.success(), "the MCP tests failed:\n{said}");

    // stdio: run + denied; HTTP: run + denied + image. Each one decision event and one record.
    let pool = gw.pool().await;
    let decisions: Vec<(String, bool)> = sqlx::query_as(
        "SELECT e.status, a.allow FROM executions e JOIN audit_events a \
         ON a.execution_id = e.id AND a.kind = 'execution.decision' \
         WHERE e.session_id IS NULL ORDER BY a.seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // Per transport: one session opened, two executions in it, closed; then classroom's refused.
    let in_sessions: Vec<(String, String)> = sqlx::query_as(
        "SELECT e.status, e.tenant FROM executions e JOIN audit_events a \
         ON a.execution_id = e.id AND a.kind = 'execution.decision' \
         WHERE e.session_id IS NOT NULL ORDER BY a.seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let session_events: Vec<(String, String)> = sqlx::query_as(
        "SELECT kind, tenant FROM audit_events WHERE kind LIKE 'session.%' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // request_access over each transport opened one agent proposal, and only that.
    let asked: Vec<(String, String)> =
        sqlx::query_as("SELECT origin, status FROM policy_proposals ORDER BY created_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(asked, vec![("agent".to_owned(), "open".to_owned()); 2]);
    pool.close().await;
    let acme = |kind: &str| (kind.to_owned(), "acme".to_owned());
    assert_eq!(
        in_sessions,
        vec![acme("succeeded"); 4],
        "each run_in_session is one decided, recorded execution of the key's tenant"
    );
    let per_transport = [acme("session.created"), acme("session.closed")];
    let denied = ("session.denied".to_owned(), "classroom".to_owned());
    assert_eq!(
        session_events,
        [&per_transport[..], &per_transport[..], &[denied]].concat()
    );
    gw.stop().await;
    let statuses: Vec<&str> = decisions
        .iter()
        .map(|(status, _)| status.as_str())
        .collect();
    assert_eq!(
        statuses,
        ["succeeded", "denied", "succeeded", "denied", "succeeded"],
        "{decisions:?}"
    );
}
