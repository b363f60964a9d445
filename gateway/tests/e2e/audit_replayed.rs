//! A chain written before the session, approval and execution payloads were typed
//! (`tests/fixtures/chain_before_typed_sessions.jsonl`: 26 `audit_events` rows a gateway of that
//! time wrote for keys, executions allowed, denied and held, approvals approved and rejected, a
//! policy proposal, sessions opened, held, approved, denied and closed, and session files), loaded
//! into a fresh database of this version: `sandgate audit verify` accepts it, and each payload
//! reads into its typed struct and writes back the same bytes, so the chain hashes the same
//! row (a renamed, added or skipped field fails here).

use std::process::Command;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;

use gateway::audit::chain::hash;
use gateway::audit::events::{self, approvals, keys, proposals, session_files, sessions};
use gateway::audit::verify::StoredEvent;
use gateway::audit::AuditStore;
use policy_engine::{Decision, PolicyInput, Reason};

use crate::common;

const BEFORE: &str = include_str!("../fixtures/chain_before_typed_sessions.jsonl");

/// The stored `value`, read into `T` and written again.
fn again<T: Serialize + DeserializeOwned>(value: &Value) -> Value {
    let typed: T =
        serde_json::from_value(value.clone()).unwrap_or_else(|err| panic!("{err}: {value}"));
    events::column(&typed)
}

/// The `input` and `decision` of `event` through their typed structs.
fn retyped(event: &StoredEvent) -> (Value, Value) {
    let (input, decision) = (&event.input, &event.decision);
    let held_session = input.get("session_id").is_some();
    match event.kind.as_str() {
        "key.create" => (
            again::<keys::KeyCreate>(input),
            again::<keys::KeyCreated>(decision),
        ),
        "execution.decision" => (again::<PolicyInput>(input), again::<Decision>(decision)),
        "approval.requested" if held_session => (
            again::<approvals::SessionRequested>(input),
            again::<approvals::SessionPending>(decision),
        ),
        "approval.requested" => (
            again::<approvals::ExecutionRequested>(input),
            again::<approvals::Pending>(decision),
        ),
        "approval.approved" | "approval.rejected" => (
            again::<approvals::Reviewed>(input),
            again::<approvals::Verdict>(decision),
        ),
        "policy.proposed" => (
            again::<proposals::Proposal>(input),
            again::<proposals::Proposed>(decision),
        ),
        // An approved session's decision is the stored one (the policy's, with its id).
        "session.created" if input.get("reviewer").is_some() => {
            (again::<sessions::ApprovedOpen>(input), decision.clone())
        }
        "session.created" => (
            again::<sessions::Opened>(input),
            again::<Decision>(decision),
        ),
        "session.denied" => (
            again::<sessions::Denial>(input),
            again::<sessions::Denied>(decision),
        ),
        "session.closed" => (
            again::<sessions::SessionRef>(input),
            again::<sessions::HeldClosed>(decision),
        ),
        "session.file_written" => (
            again::<session_files::FileWritten>(input),
            again::<session_files::NoDecision>(decision),
        ),
        "session.file_moved" => (
            again::<session_files::FileMoved>(input),
            again::<session_files::NoDecision>(decision),
        ),
        other => panic!("the fixture has a kind this test does not type: {other}"),
    }
}

async fn loaded() -> (String, PgPool) {
    let url = common::fresh_database().await;
    let options: PgConnectOptions = url.parse().unwrap();
    gateway::database::migrate_as_owner(&options).await.unwrap();
    let pool = PgPool::connect_with(options).await.unwrap();
    for line in BEFORE.lines() {
        sqlx::query(
            "INSERT INTO audit_events SELECT * FROM jsonb_populate_record(NULL::audit_events, $1)",
        )
        .bind(serde_json::from_str::<Value>(line).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    }
    (url, pool)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_written_before_the_typed_payloads_verifies_and_reads_back_byte_for_byte() {
    let (url, pool) = loaded().await;
    let verified = AuditStore::new(pool.clone()).verify_chain().await.unwrap();
    assert_eq!((verified.events, verified.broken.is_none()), (26, true));
    let data_dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["audit", "verify"])
        .env("SANDGATE_DATABASE_URL", &url)
        .env("SANDGATE_DATA_DIR", data_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");

    let stored: Vec<StoredEvent> = sqlx::query_as(&format!(
        "SELECT {} FROM audit_events ORDER BY seq",
        gateway::audit::verify::STORED_COLUMNS
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    for event in &stored {
        let mut typed = event.clone();
        (typed.input, typed.decision) = retyped(event);
        typed.reasons = again::<Vec<Reason>>(&event.reasons);
        assert_eq!(
            typed.input.to_string(),
            event.input.to_string(),
            "{}",
            event.kind
        );
        assert_eq!(
            typed.decision.to_string(),
            event.decision.to_string(),
            "{}",
            event.kind
        );
        assert_eq!(
            hash(typed.hash_version, &typed.prev_hash, &typed.row()),
            event.hash,
            "{} {}: the typed payload hashes as the stored one",
            event.seq,
            event.kind
        );
    }
    pool.close().await;
}
