//! The auditor's way into the embedded database (issue 16 item 14): `audit_listen` makes the
//! cluster listen on TCP where only `sandgate_auditor`, with the password from the file, gets
//! in (read-only: the views, no writes); `sandgate audit psql` opens psql as that role on the
//! socket. Real embedded PostgreSQL, real psql.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::common;

use std::process::Command;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use common::TestGateway;

const PASSWORD: &str = "correct horse battery staple";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn over_tcp(port: u16, user: &str, password: &str) -> PgConnectOptions {
    PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username(user)
        .password(password)
        .database("sandgate")
        .disable_statement_logging()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_auditor_logs_in_over_tcp_and_audit_psql_is_read_only() {
    let secrets = tempfile::tempdir().unwrap();
    let password_file = secrets.path().join("auditor.password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let port = free_port();
    let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let file = password_file.clone();
    let gw = TestGateway::start_with(None, move |config| {
        config.audit_listen = Some(gateway::config::AuditListen {
            address,
            password_file: file,
        });
    })
    .await;

    // The auditor, with its password: reads the views, writes nothing.
    let mut auditor = over_tcp(port, "sandgate_auditor", PASSWORD)
        .connect()
        .await
        .unwrap();
    let executions: i64 = sqlx::query_scalar("SELECT count(*) FROM v_executions")
        .fetch_one(&mut auditor)
        .await
        .unwrap();
    assert_eq!(executions, 0);
    let write = sqlx::query("INSERT INTO policy_revisions (revision) VALUES ('x')")
        .execute(&mut auditor)
        .await
        .unwrap_err();
    assert!(write.to_string().contains("permission denied"), "{write}");
    auditor.close().await.unwrap();

    // Anyone else, or a wrong password, is refused.
    for (user, password) in [
        ("sandgate_auditor", "wrong password!!"),
        ("postgres", PASSWORD),
        ("sandgate_app", PASSWORD),
    ] {
        let refused = sqlx::PgConnection::connect_with(&over_tcp(port, user, password)).await;
        let err = refused
            .err()
            .unwrap_or_else(|| panic!("{user} got in over TCP"));
        let text = err.to_string();
        assert!(
            text.contains("password authentication failed") || text.contains("pg_hba.conf"),
            "{user}: {text}"
        );
    }

    // `sandgate audit psql` on the same (running) cluster: the auditor role, read-only.
    let psql = |sql: &str| {
        Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .args(["audit", "psql", "--", "-X", "-A", "-t", "-c", sql])
            .env("SANDGATE_DATA_DIR", gw.data_dir.path())
            .env(
                "SANDGATE_AUDIT_LISTEN",
                format!(
                    "{{address: '127.0.0.1:{port}', password_file: '{}'}}",
                    password_file.display()
                ),
            )
            .output()
            .unwrap()
    };
    let who = psql("SELECT current_user, count(*) FROM v_decisions");
    assert!(who.status.success(), "{who:?}");
    assert_eq!(
        String::from_utf8_lossy(&who.stdout).trim(),
        "sandgate_auditor|0"
    );
    let write = psql("DELETE FROM api_keys");
    assert!(!write.status.success(), "{write:?}");
    assert!(
        String::from_utf8_lossy(&write.stderr).contains("permission denied"),
        "{write:?}"
    );
    gw.stop().await;
}
