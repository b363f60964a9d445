//! Every SQL query in `dashboards/*.json` runs, as the read-only `sandgate_auditor` role, against
//! a migrated database holding data of every kind (executions allowed, denied and running, egress
//! allowed and denied, approvals waiting and decided, an authentication failure), reads only the
//! `v_*` views, and returns rows.

use crate::common;

use std::collections::BTreeSet;

use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::types::Json;
use sqlx::PgPool;

use gateway::audit::egress::{
    ConnectionClose, ConnectionOpen, EgressOwner, RequestClose, RequestOpen,
};
use gateway::audit::sessions::SessionRow;
use gateway::audit::{AuditStore, Completion, ExecutionRow, NewEvent};

/// Tables a dashboard must not read directly: the views are the dashboards' interface.
const BASE_TABLES: &[&str] = &[
    "audit_events",
    "executions",
    "egress_connections",
    "egress_requests",
    "approvals",
    "api_keys",
    "policy_revisions",
];

/// The `(...)` argument text of a macro call starting at `start` (nested parentheses allowed).
fn macro_call(sql: &str, start: usize, name: &str) -> (usize, String) {
    let open = start + name.len();
    let mut depth = 0;
    for (offset, c) in sql[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return (open + offset, sql[open + 1..open + offset].to_owned());
                }
            }
            _ => {}
        }
    }
    panic!("unclosed {name} in {sql}");
}

/// Replaces the Grafana macros the dashboards use with plain SQL over the last day.
fn expand_macros(sql: &str) -> String {
    let mut out = sql.to_owned();
    let bucket =
        |column: &str| format!("to_timestamp(floor(extract(epoch FROM {column}) / 300) * 300)");
    for (name, expand) in [
        (
            "$__timeGroupAlias",
            &(|args: &str| format!("{} AS time", bucket(args.split(',').next().unwrap().trim())))
                as &dyn Fn(&str) -> String,
        ),
        ("$__timeGroup", &|args: &str| {
            bucket(args.split(',').next().unwrap().trim())
        }),
        ("$__timeFilter", &|args: &str| {
            format!("{} BETWEEN now() - interval '1 day' AND now()", args.trim())
        }),
        ("$__timeFrom", &|_: &str| {
            "(now() - interval '1 day')".to_owned()
        }),
        ("$__timeTo", &|_: &str| "now()".to_owned()),
    ] {
        while let Some(start) = out.find(&format!("{name}(")) {
            let (end, args) = macro_call(&out, start, name);
            out.replace_range(start..=end, &expand(&args));
        }
    }
    assert!(!out.contains("$__"), "unknown Grafana macro in {sql}");
    out
}

/// Base tables named after FROM or JOIN.
fn tables_read(sql: &str) -> Vec<String> {
    let words: Vec<String> = sql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    words
        .windows(2)
        .filter(|pair| pair[0] == "from" || pair[0] == "join")
        .map(|pair| pair[1].clone())
        .filter(|table| BASE_TABLES.contains(&table.as_str()))
        .collect()
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

fn execution(id: &str, tenant: &str, allow: bool, status: &str) -> ExecutionRow {
    ExecutionRow {
        id: id.into(),
        tenant: tenant.into(),
        key_id: "key_1".into(),
        language: "python".into(),
        code_sha256: "00".into(),
        code_bytes: 1,
        labels: Json(json!({})),
        status: gateway::status::ExecutionStatus::parse(status).unwrap(),
        decision_id: format!("dc_{id}"),
        allow,
        reasons: Json(vec![]),
        backend: allow.then(|| "gvisor".into()),
        runtime: None,
        image: None,
        limits: None,
        policy_revision: "sha256:test".into(),
        created_at: gateway::ids::now_micros() - chrono::Duration::seconds(5),
        started_at: None,
        finished_at: (!allow).then(gateway::ids::now_micros),
        exit_code: None,
        duration_ms: None,
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
        start: None,
        container: None,
        session_id: None,
        result: None,
        results: None,
        resumed: false,
    }
}

fn decision_event(row: &ExecutionRow) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::ExecutionDecision,
        execution_id: Some(row.id.clone()),
        key_id: Some(row.key_id.clone()),
        tenant: Some(row.tenant.clone()),
        decision_id: Some(row.decision_id.clone()),
        allow: Some(row.allow),
        reasons: if row.allow {
            json!([])
        } else {
            json!([{"code": "language.not_allowed", "message": "x"}])
        },
        input: json!({}),
        decision: json!({"allow": row.allow, "require_approval": row.status == gateway::status::ExecutionStatus::PendingApproval}),
        policy_revision: Some("sha256:test".into()),
    }
}

fn attempt(execution_id: &str, host: &str, allow: bool) -> ConnectionOpen {
    ConnectionOpen {
        owner: EgressOwner {
            execution_id: Some(execution_id.into()),
            session_id: None,
        },
        tenant: "acme".into(),
        host: host.into(),
        port: 443,
        scheme: "connect".into(),
        sni: None,
        method: None,
        path: None,
        resolved_addr: allow.then(|| "192.0.2.1".into()),
        allow,
        reason: if allow {
            "egress.allowed"
        } else {
            "egress.host_not_granted"
        }
        .into(),
        message: String::new(),
        policy_reasons: json!([]),
        policy_revision: "sha256:test".into(),
        opened_at: gateway::ids::now_micros(),
    }
}

/// Data of every kind, written as the gateway writes it (through its own role).
async fn seed(app: &PgPool) {
    let store = AuditStore::new(app.clone());
    store
        .record_policy_revision("sha256:test", &[], "test")
        .await
        .unwrap();
    for (id, tenant, allow, status) in [
        ("ex_done", "acme", true, "queued"),
        ("ex_running", "globex", true, "queued"),
        ("ex_denied", "acme", false, "denied"),
        ("ex_review", "acme", true, "pending_approval"),
    ] {
        let row = execution(id, tenant, allow, status);
        store
            .record_execution_decision(&row, &decision_event(&row))
            .await
            .unwrap();
    }
    for id in ["ex_done", "ex_running"] {
        store
            .mark_running(
                id,
                gateway::ids::now_micros(),
                api_types::SandboxStart::Cold,
                "sandgate-test",
            )
            .await
            .unwrap();
    }
    let done = Completion {
        status: gateway::status::ExecutionStatus::Succeeded,
        exit_code: Some(0),
        duration_ms: 120,
        stdout: b"1\n".to_vec(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        error: None,
        outputs: Default::default(),
    };
    store
        .complete_execution("ex_done", &done, gateway::ids::now_micros())
        .await
        .unwrap();
    let allowed = store
        .open_connection(&attempt("ex_done", "pypi.org", true))
        .await
        .unwrap();
    let close = ConnectionClose {
        bytes_up: 512,
        bytes_down: 20_000,
        duration_ms: 80,
        close_reason: "eof".into(),
        error: None,
        closed_at: gateway::ids::now_micros(),
    };
    store.close_connection(&allowed, &close).await.unwrap();
    for (method, allow, reason, credentials) in [
        ("GET", true, "egress.allowed", vec!["github".to_owned()]),
        ("DELETE", false, "egress.method_not_allowed", vec![]),
        (
            "GET",
            false,
            "credential.misdirected",
            vec!["github".to_owned()],
        ),
    ] {
        let request = RequestOpen {
            connection_id: allowed.clone(),
            owner: EgressOwner {
                execution_id: Some("ex_done".into()),
                session_id: None,
            },
            tenant: "acme".into(),
            host: "pypi.org".into(),
            port: 443,
            method: method.into(),
            path: "/repos/acme/app".into(),
            query_sha256: None,
            header_names: vec!["host".into()],
            credentials,
            upgrade: None,
            allow,
            reason: reason.into(),
            message: String::new(),
            policy_reasons: json!([]),
            policy_revision: "sha256:test".into(),
            started_at: gateway::ids::now_micros(),
        };
        let id = store.open_request(&request).await.unwrap();
        let close = RequestClose {
            status_code: if allow { 200 } else { 403 },
            bytes_up: 300,
            bytes_down: 900,
            duration_ms: 12,
            error: None,
        };
        store.close_request(&id, &close).await.unwrap();
    }
    for host in ["evil.example", "evil.example", "169.254.169.254"] {
        store
            .open_connection(&attempt("ex_done", host, false))
            .await
            .unwrap();
    }
    sqlx::query(
        "INSERT INTO approvals (id, execution_id, status, created_at, expires_at, decided_at, \
         reviewer_key_id, comment) VALUES \
         ('ap_wait', 'ex_review', 'pending', now() - interval '10 minutes', \
          now() + interval '50 minutes', NULL, NULL, NULL), \
         ('ap_done', 'ex_done', 'approved', now() - interval '20 minutes', \
          now() + interval '40 minutes', now() - interval '15 minutes', 'key_r', 'ok')",
    )
    .execute(app)
    .await
    .unwrap();
    let failure = NewEvent {
        kind: api_types::EventKind::AuthFailure,
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
    for (id, minutes_ago) in [("ss_open", 30), ("ss_idle", 90)] {
        let created = gateway::ids::now_micros() - chrono::Duration::minutes(minutes_ago);
        let session = SessionRow {
            id: id.into(),
            tenant: "acme".into(),
            key_id: "key_1".into(),
            language: "python".into(),
            status: gateway::session_wire::SessionStatus::Ready,
            closed_reason: None,
            decision: Json(json!({})),
            limits: Json(json!({})),
            idle_timeout_s: 600,
            ttl_s: 7200,
            executions: 0,
            instance: "test".into(),
            container: None,
            created_at: created,
            last_used_at: created,
            expires_at: created + chrono::Duration::hours(2),
            closed_at: None,
            approval_id: None,
            start: None,
        };
        store
            .insert_session(&session, usize::MAX)
            .await
            .unwrap()
            .unwrap();
    }
    store
        .close_session("ss_idle", gateway::session_wire::ClosedReason::Idle)
        .await
        .unwrap();
}

#[test]
fn macros_expand_to_plain_sql() {
    assert_eq!(
        expand_macros("SELECT $__timeGroupAlias(time, '5m') WHERE $__timeFilter(time)"),
        "SELECT to_timestamp(floor(extract(epoch FROM time) / 300) * 300) AS time \
         WHERE time BETWEEN now() - interval '1 day' AND now()"
    );
    assert_eq!(
        tables_read("SELECT 1 FROM v_executions JOIN executions ON true"),
        vec!["executions".to_owned()]
    );
    assert!(tables_read("SELECT count(*) AS executions FROM v_executions").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_query_runs_on_the_views() {
    let url = common::fresh_database().await;
    let options: PgConnectOptions = url.parse().unwrap();
    gateway::database::migrate_as_owner(&options).await.unwrap();
    let app = gateway::database::pool(options.clone()).await.unwrap();
    seed(&app).await;
    app.close().await;
    // Grafana's datasource: a login role holding sandgate_auditor.
    let auditor = PgPool::connect_with(options.options([("role", "sandgate_auditor")]))
        .await
        .unwrap();

    let dir = common::workspace_root().join("dashboards");
    let mut checked = 0;
    let mut uids = BTreeSet::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 4, "dashboards: {paths:?}");
    for path in paths {
        let name = path.display().to_string();
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        let uid = dashboard["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no uid"));
        assert!(uids.insert(uid.to_owned()), "{name}: uid {uid} used twice");
        let mut found = Vec::new();
        for panel in dashboard["panels"].as_array().unwrap() {
            assert_eq!(
                panel["datasource"]["type"], "grafana-postgresql-datasource",
                "{name} / {}",
                panel["title"]
            );
            queries(panel, &mut found);
        }
        assert!(!found.is_empty(), "{name} has no queries");
        for (title, sql) in found {
            let direct = tables_read(&sql);
            assert!(
                direct.is_empty() && sql.contains("v_"),
                "{name} / {title} must read the v_* views, not {direct:?}:\n{sql}"
            );
            let rows = sqlx::query(&expand_macros(&sql))
                .fetch_all(&auditor)
                .await
                .unwrap_or_else(|err| panic!("{name} / {title}: {err}\n{sql}"));
            assert!(
                !rows.is_empty(),
                "{name} / {title} returned no rows on seeded data"
            );
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} queries found");

    // The views say what was seeded.
    let denied: Vec<(String, i64)> =
        sqlx::query_as("SELECT host, attempts FROM v_denied_egress ORDER BY attempts DESC, host")
            .fetch_all(&auditor)
            .await
            .unwrap();
    assert_eq!(
        denied,
        vec![
            ("evil.example".to_owned(), 2),
            ("169.254.169.254".to_owned(), 1)
        ]
    );
    let waiting: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT id, tenant, age_seconds FROM v_approvals_waiting")
            .fetch_all(&auditor)
            .await
            .unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].0.as_str(), waiting[0].1.as_str()),
        ("ap_wait", "acme")
    );
    assert!((590..=700).contains(&waiting[0].2), "{waiting:?}");
    let reasons: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT outcome, reason_code FROM v_decisions \
         WHERE kind = 'execution.decision' ORDER BY seq",
    )
    .fetch_all(&auditor)
    .await
    .unwrap();
    assert_eq!(
        reasons.len(),
        4,
        "one row per decision without reasons or per reason"
    );
    assert!(reasons.contains(&("deny".to_owned(), Some("language.not_allowed".to_owned()))));
    assert!(
        reasons.contains(&("review".to_owned(), None)),
        "{reasons:?}"
    );
    assert!(reasons.contains(&("allow".to_owned(), None)), "{reasons:?}");
    let open: Vec<(String, i64)> = sqlx::query_as("SELECT id, age_seconds FROM v_sessions_open")
        .fetch_all(&auditor)
        .await
        .unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].0, "ss_open");
    assert!((1790..=1900).contains(&open[0].1), "{open:?}");
    let by_status: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT tenant, backend, status, count(*) FROM v_executions GROUP BY 1, 2, 3 ORDER BY 1, 3",
    )
    .fetch_all(&auditor)
    .await
    .unwrap();
    assert_eq!(
        by_status,
        vec![
            ("acme".into(), "-".into(), "denied".into(), 1),
            ("acme".into(), "gvisor".into(), "pending_approval".into(), 1),
            ("acme".into(), "gvisor".into(), "succeeded".into(), 1),
            ("globex".into(), "gvisor".into(), "running".into(), 1),
        ]
    );
    auditor.close().await;
}

/// The auditor page's series (`GET /v1/audit/summary`) say what was seeded, read through the
/// gateway's own role, as the API reads them.
#[tokio::test(flavor = "multi_thread")]
async fn the_auditor_page_summary_counts_what_the_views_hold() {
    let url = common::fresh_database().await;
    let options: PgConnectOptions = url.parse().unwrap();
    gateway::database::migrate_as_owner(&options).await.unwrap();
    let app = gateway::database::pool(options.clone()).await.unwrap();
    seed(&app).await;
    let since = chrono::Utc::now() - chrono::Duration::days(1);
    let summary = AuditStore::new(app.clone())
        .summary(since, 1800)
        .await
        .unwrap();
    let s = serde_json::to_value(&summary).unwrap();
    app.close().await;

    let total = |outcome: &str| -> i64 {
        s["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["outcome"] == outcome)
            .map(|b| b["decisions"].as_i64().unwrap())
            .sum()
    };
    // Decisions: 3 executions allowed (one to review), 1 denied; egress attempts 1 allowed,
    // 3 denied; requests 1 allowed, 2 denied; the authentication failure denied.
    assert_eq!(total("review"), 1, "{s}");
    assert!(total("deny") >= 2, "{s}");
    assert!(total("allow") >= 2, "{s}");
    let denials = &s["denials"];
    assert!(
        denials
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["reason"] == "language.not_allowed" && d["decisions"] == 1),
        "{denials}"
    );
    let egress = s["egress"].as_array().unwrap();
    assert!(
        egress.contains(&json!({"host": "evil.example", "outcome": "deny", "attempts": 2})),
        "{egress:?}"
    );
    assert!(
        egress.contains(&json!({"host": "pypi.org", "outcome": "allow", "attempts": 1})),
        "{egress:?}"
    );
    assert_eq!(s["approvals_waiting"][0]["id"], "ap_wait", "{s}");
    let statuses: Vec<&str> = s["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["denied", "pending_approval", "running", "succeeded"]
    );
    let done = s["executions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["status"] == "succeeded")
        .unwrap();
    assert_eq!(done["max_ms"], 120, "{done}");
    let open = s["sessions_open"].as_array().unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["id"], "ss_open");
}
