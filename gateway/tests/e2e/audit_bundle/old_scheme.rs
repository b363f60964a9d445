//! A chain begun under hash scheme 1 still verifies, and a filtered bundle says what it cannot prove.

use chrono::{SecondsFormat, Utc};
use serde_json::json;

use super::forger::*;
use crate::common::{self, TestGateway};

/// One row as the gateway wrote it before hash schemes: hashed as sha256(prev || canonical), and
/// inserted without naming `hash_version`.
async fn insert_old_row(pool: &sqlx::PgPool, seq: i64, tenant: &str, prev: &str) -> String {
    let at =
        (Utc::now() - chrono::Duration::hours(30)).to_rfc3339_opts(SecondsFormat::Micros, true);
    let mut row = json!({
        "seq": seq, "id": format!("ev_old{seq}"), "at": at, "kind": "execution.decision",
        "execution_id": format!("ex_old{seq}"), "key_id": null, "tenant": tenant,
        "decision_id": format!("dc_old{seq}"), "allow": false,
        "reasons": [{"code": "language.unsupported", "message": "old"}],
        "input": {"request": {"language": "cobol", "code": format!("old {tenant}")}},
        "decision": {"allow": false}, "policy_revision": null, "prev_hash": prev,
    });
    let hash = row_hash(&row);
    row["hash"] = json!(hash);
    sqlx::query(
        "INSERT INTO audit_events (seq, id, at, kind, execution_id, key_id, tenant, decision_id, \
         allow, reasons, input, decision, policy_revision, prev_hash, hash) \
         VALUES ($1, $2, $3::timestamptz, $4, $5, NULL, $6, $7, false, $8, $9, $10, NULL, $11, $12)",
    )
    .bind(seq)
    .bind(row["id"].as_str())
    .bind(&at)
    .bind("execution.decision")
    .bind(row["execution_id"].as_str())
    .bind(tenant)
    .bind(row["decision_id"].as_str())
    .bind(&row["reasons"])
    .bind(&row["input"])
    .bind(&row["decision"])
    .bind(prev)
    .bind(&hash)
    .execute(pool)
    .await
    .unwrap();
    hash
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_the_old_scheme_still_verifies_and_a_filtered_bundle_says_what_it_cannot_prove()
{
    // A database migrated to today, holding a chain the gateway wrote before hash schemes.
    let url = common::fresh_database().await;
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    gateway::database::migrate_as_owner(&options).await.unwrap();
    let pool = sqlx::PgPool::connect_with(options).await.unwrap();
    let mut prev = GENESIS.to_owned();
    for (seq, tenant) in [(1, "acme"), (2, "globex"), (3, "acme"), (4, "globex")] {
        prev = insert_old_row(&pool, seq, tenant, &prev).await;
    }
    // New events join it.
    let gw = TestGateway::start_with(Some(url.clone()), |_| {}).await;
    interleaved_denials(&gw).await;
    let auditor = gw.key("auditor", "audit").await;
    let output = sandgate(&url, gw.data_dir.path(), &["audit", "verify"]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).starts_with("ok "), "{}", text(&output));
    let dir = tempfile::tempdir().unwrap();

    // Filtered to acme: globex's old events are links only and cannot be recomputed.
    let acme = dir.path().join("acme.jsonl");
    export(&gw, &acme, &["--tenant", "acme"]);
    let (ok, said) = verify_offline(&acme, &[]);
    assert!(
        !ok,
        "a bundle with old links taken as given said ok: {said}"
    );
    assert!(said.starts_with("unproven events 1.."), "{said}");
    assert!(
        said.contains(
            "2 events shown without content and without the parts of their hash (events 2..4)"
        ),
        "{said}"
    );
    println!("old links omitted: {said}");

    let versions: Vec<(i64, i16)> =
        sqlx::query_as("SELECT seq, hash_version FROM audit_events ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(versions[..4].iter().all(|(_, v)| *v == 1), "{versions:?}");
    assert!(versions[4..].iter().all(|(_, v)| *v == 2), "{versions:?}");
    assert!(versions.len() > 8, "{versions:?}");
    // The API shows every event's scheme too.
    let (status, page) = gw.get(&auditor, "/v1/audit/events?limit=1000").await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<(i64, i16)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| {
            let version = event["hash_version"].as_i64();
            let version = version.unwrap_or_else(|| panic!("no hash_version: {event}"));
            (event["seq"].as_i64().unwrap(), version as i16)
        })
        .rev()
        .collect();
    assert_eq!(listed, versions, "{page}");
    pool.close().await;
    let output = sandgate(&url, gw.data_dir.path(), &["audit", "verify"]);
    assert!(
        text(&output).starts_with(&format!("ok {} events", versions.len())),
        "{}",
        text(&output)
    );
    let head = anchor(&gw);
    let (ok, said) = verify_offline(&acme, &["--head", &head]);
    assert!(!ok && said.starts_with("unproven "), "{said}");

    // Unfiltered, the old events carry their content and are recomputed: proven.
    let all = dir.path().join("all.jsonl");
    export(&gw, &all, &[]);
    let (ok, said) = verify_offline(&all, &["--head", &head]);
    assert!(ok, "{said}");
    assert!(said.starts_with("ok events 1.."), "{said}");

    // A window of new events only: every omitted link is recomputed.
    let recent = dir.path().join("recent.jsonl");
    export(&gw, &recent, &["--tenant", "acme", "--since", "1h"]);
    let (ok, said) = verify_offline(&recent, &["--head", &head]);
    assert!(ok, "{said}");
    assert!(said.contains("filtered to tenant acme"), "{said}");
    gw.stop().await;
}
