//! Every SQL query in `dashboards/*.json` runs against a migrated database with data in it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod common;

use serde_json::{json, Value};
use sqlx::types::Json;

use gateway::audit::{AuditStore, Completion, ExecutionRow, NewEvent};

/// Replaces the Grafana macros the dashboards use with plain SQL.
fn expand_macros(sql: &str) -> String {
    let mut out = sql.to_owned();
    while let Some(start) = out.find("$__timeGroupAlias(") {
        let end = start + out[start..].find(')').expect("closing parenthesis");
        let args = &out[start + "$__timeGroupAlias(".len()..end];
        let column = args.split(',').next().unwrap().trim();
        let replacement =
            format!("to_timestamp(floor(extract(epoch FROM {column}) / 300) * 300) AS time");
        out.replace_range(start..=end, &replacement);
    }
    while let Some(start) = out.find("$__timeFilter(") {
        let end = start + out[start..].find(')').expect("closing parenthesis");
        let column = out[start + "$__timeFilter(".len()..end].trim().to_owned();
        let replacement = format!("{column} BETWEEN now() - interval '1 day' AND now()");
        out.replace_range(start..=end, &replacement);
    }
    assert!(!out.contains("$__"), "unknown Grafana macro in {sql}");
    out
}

fn queries(panel: &Value, out: &mut Vec<(String, String)>) {
    let title = panel["title"].as_str().unwrap_or("?").to_owned();
    for target in panel["targets"].as_array().into_iter().flatten() {
        if let Some(sql) = target["rawSql"].as_str() {
            out.push((title.clone(), sql.to_owned()));
        }
    }
    for inner in panel["panels"].as_array().into_iter().flatten() {
        queries(inner, out);
    }
}

async fn seed(store: &AuditStore) {
    store
        .record_policy_revision("sha256:test", &[], "test")
        .await
        .unwrap();
    let now = gateway::ids::now_micros();
    for (id, allow, status) in [("ex_a", true, "succeeded"), ("ex_b", false, "denied")] {
        let row = ExecutionRow {
            id: id.into(),
            tenant: "acme".into(),
            key_id: "key_1".into(),
            language: "python".into(),
            code_sha256: "00".into(),
            code_bytes: 1,
            labels: Json(json!({})),
            status: status.into(),
            decision_id: format!("dc_{id}"),
            allow,
            reasons: Json(vec![]),
            backend: allow.then(|| "gvisor".into()),
            runtime: None,
            image: None,
            limits: None,
            policy_revision: "sha256:test".into(),
            created_at: now,
            started_at: None,
            finished_at: Some(now),
            exit_code: None,
            duration_ms: Some(120),
            stdout: None,
            stderr: None,
            stdout_truncated: false,
            stderr_truncated: false,
            outputs: Json(json!([])),
            error: None,
            instance: None,
            outputs_skipped: Json(json!([])),
            outputs_truncated: false,
            purged_at: None,
        };
        let event = NewEvent {
            kind: "execution.decision",
            execution_id: Some(id.into()),
            key_id: Some("key_1".into()),
            tenant: Some("acme".into()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(allow),
            reasons: if allow {
                json!([])
            } else {
                json!([{"code": "tenant.unknown", "message": "x"}])
            },
            input: json!({}),
            decision: json!({"allow": allow}),
            policy_revision: Some("sha256:test".into()),
        };
        store.record_execution_decision(&row, &event).await.unwrap();
    }
    let done = Completion {
        status: "succeeded",
        exit_code: Some(0),
        duration_ms: 120,
        stdout: "1\n".into(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        error: None,
        outputs: Default::default(),
    };
    store.complete_execution("ex_a", &done).await.unwrap();
    let failure = NewEvent {
        kind: "auth.failure",
        execution_id: None,
        key_id: None,
        tenant: None,
        decision_id: None,
        allow: Some(false),
        reasons: json!([{"code": "auth.unknown_key", "message": "x"}]),
        input: json!({"path": "/v1/executions"}),
        decision: json!({"allow": false}),
        policy_revision: None,
    };
    store.record_event(&failure).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_query_runs() {
    let url = common::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    gateway::database::migrate(&pool).await.unwrap();
    seed(&AuditStore::new(pool.clone())).await;

    let dir = common::workspace_root().join("dashboards");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        let mut found = Vec::new();
        for panel in dashboard["panels"].as_array().unwrap() {
            queries(panel, &mut found);
        }
        for (title, sql) in found {
            let rows = sqlx::query(&expand_macros(&sql))
                .fetch_all(&pool)
                .await
                .unwrap_or_else(|err| panic!("{} / {title}: {err}\n{sql}", path.display()));
            assert!(
                !rows.is_empty(),
                "{} / {title} returned no rows on seeded data",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} queries found");
}
