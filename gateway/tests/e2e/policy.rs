//! The security team's workflow end to end: a broken policy denies (fail closed), reloads are
//! checked before they take effect, dry-run evaluation, and replay of past decisions.

use crate::common;

use std::path::Path;

use serde_json::json;

use common::{copy_of_shipped, fresh_database, workspace_root, TestGateway};

const LIMITS: &str = r#"{"timeout_ms": 5000, "memory_mb": 256, "cpus": 1.0, "pids": 256, "disk_mb": 64, "output_bytes": 65536}"#;

fn bundle(rego: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.rego"), rego).unwrap();
    dir
}

async fn gateway_with_policy(dir: &Path) -> TestGateway {
    let url = fresh_database().await;
    let dir = dir.to_owned();
    TestGateway::start_with(Some(url), move |config| config.policy_dir = dir).await
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_policies_deny_with_policy_error_and_say_why_in_the_audit_row() {
    let runtime_error = bundle(&format!(
        "package sandgate.execution\n\
         decision := {{\"allow\": true, \"backend\": \"gvisor\", \"limits\": {LIMITS}}} if {{\n\
           to_number(input.request.language) > 0\n\
         }}\n"
    ));
    let unknown_field = bundle(
        "package sandgate.execution\n\
         decision := {\"allow\": false, \"reasons\": [], \"colour\": \"red\"}\n",
    );
    let too_slow = bundle(&format!(
        "package sandgate.execution\n\
         decision := {{\"allow\": n >= 0, \"backend\": \"gvisor\", \"limits\": {LIMITS}}} if {{\n\
           n := count([1 | some i in numbers.range(1, 4000); some j in numbers.range(1, 4000)])\n\
         }}\n"
    ));
    let empty = tempfile::tempdir().unwrap();
    for (name, dir) in [
        ("runtime error", runtime_error.path()),
        ("unknown field", unknown_field.path()),
        ("time limit", too_slow.path()),
        ("empty dir", empty.path()),
    ] {
        let gw = gateway_with_policy(dir).await;
        let key = gw.key("agent", "acme").await;
        let (status, body) = gw.execute(&key, "python", "print(1)", json!({})).await;
        assert_eq!(status, 403, "{name}: {body}");
        assert_eq!(body["error"]["code"], "policy_denied", "{name}");
        assert_eq!(
            body["error"]["reasons"][0]["code"], "policy.error",
            "{name}: {body}"
        );
        let id = body["error"]["execution_id"].as_str().unwrap();
        let pool = gw.pool().await;
        let (allow, reasons): (Option<bool>, serde_json::Value) =
            sqlx::query_as("SELECT allow, reasons FROM audit_events WHERE execution_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(allow, Some(false), "{name}");
        let message = reasons[0]["message"].as_str().unwrap();
        assert_eq!(reasons[0]["code"], "policy.error");
        assert!(
            message.len() > 10,
            "{name}: the error text is in the audit row: {reasons}"
        );
        if name == "time limit" {
            assert!(message.contains("time limit"), "{message}");
        }
        gw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_rejects_broken_bundles_and_applies_good_ones() {
    let dir = copy_of_shipped();
    let gw = gateway_with_policy(dir.path()).await;
    let admin = gw.key("admin", "ops").await;
    let agent = gw.key("agent", "acme").await;
    let (_, policy) = gw.get(&admin, "/v1/policy").await;
    let first = policy["revision"].as_str().unwrap().to_owned();

    // Only admins reload.
    let (status, _) = gw.post(&agent, "/v1/policy/reload", &json!({})).await;
    assert_eq!(status, 403);

    // A bundle that does not parse: rejected, the first revision keeps deciding.
    std::fs::write(
        dir.path().join("broken.rego"),
        "package sandgate.execution\ndecision := {",
    )
    .unwrap();
    let (status, body) = gw.post(&admin, "/v1/policy/reload", &json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["reasons"][0]["code"], "policy.rejected");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&first),
        "{body}"
    );
    let (status, run) = gw.execute(&agent, "python", "print(6*7)", json!({})).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["stdout"], "42\n");
    assert_eq!(run["decision"]["policy_revision"], first.as_str());
    std::fs::remove_file(dir.path().join("broken.rego")).unwrap();

    // A bundle that loads but fails its own test cases: rejected too.
    let tenants = dir.path().join("data/tenants.yaml");
    let original = std::fs::read_to_string(&tenants).unwrap();
    let mut data: serde_yaml_ng::Value = serde_yaml_ng::from_str(&original).unwrap();
    data["tenants"]["acme"]["languages"] = serde_yaml_ng::from_str("[ruby]").unwrap();
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    let (status, body) = gw.post(&admin, "/v1/policy/reload", &json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("failed"),
        "{body}"
    );
    std::fs::write(&tenants, &original).unwrap();

    // A good change takes effect; new decisions carry the new revision.
    let rego = dir.path().join("execution.rego");
    let mut text = std::fs::read_to_string(&rego).unwrap();
    text.push_str("\n# reviewed change: comment only\n");
    std::fs::write(&rego, text).unwrap();
    let (status, body) = gw.post(&admin, "/v1/policy/reload", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], true);
    let second = body["revision"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    let (_, run) = gw.execute(&agent, "bash", "echo ok", json!({})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["decision"]["policy_revision"], second.as_str());

    // Each accepted revision is stored once, with who loaded it; every attempt is an event.
    let pool = gw.pool().await;
    let revisions: Vec<(String, String)> =
        sqlx::query_as("SELECT revision, loaded_by FROM policy_revisions ORDER BY loaded_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(revisions.len(), 2, "{revisions:?}");
    assert_eq!(revisions[0], (first.clone(), "startup".to_owned()));
    assert_eq!(revisions[1].0, second);
    assert!(revisions[1].1.starts_with("key_"), "{revisions:?}");
    let reloads: Vec<(Option<bool>,)> =
        sqlx::query_as("SELECT allow FROM audit_events WHERE kind = 'policy.reload' ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(reloads, [(Some(false),), (Some(false),), (Some(true),)]);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn evaluate_is_a_dry_run_for_reviewers_and_admins() {
    let gw = TestGateway::start().await;
    let reviewer = gw.key("reviewer", "security").await;
    let agent = gw.key("agent", "acme").await;
    let input = json!({
        "principal": {"key_id": "key_x", "tenant": "classroom", "role": "agent"},
        "request": {"language": "bash", "code_sha256": "00", "code_bytes": 1, "files": [],
                    "network": [], "mounts": [], "limits": {}, "labels": {}},
        "environment": {"backends": ["gvisor"], "datasets": [], "now": "2026-11-30T00:00:00Z"}
    });
    let (status, body) = gw
        .post(&reviewer, "/v1/policy/evaluate", &json!({"input": input}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"]["allow"], false);
    assert_eq!(body["reasons"][0]["code"], "language.not_allowed", "{body}");
    assert!(body["revision"].as_str().unwrap().starts_with("sha256:"));

    let (status, _) = gw
        .post(&agent, "/v1/policy/evaluate", &json!({"input": input}))
        .await;
    assert_eq!(status, 403, "agents may not probe the policy");

    let egress = json!({
        "execution": {"id": "ex_1", "tenant": "acme",
                      "grant": {"allow": [{"host": "pypi.org", "ports": [443]}],
                                "max_connections": 8, "max_bytes": 1000}},
        "connection": {"host": "evil.example", "port": 443, "scheme": "https"}
    });
    let (status, body) = gw
        .post(
            &reviewer,
            "/v1/policy/evaluate",
            &json!({"input": egress, "entry_point": "egress"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"]["allow"], false, "{body}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_reports_the_blast_radius_of_a_stricter_policy() {
    let gw = TestGateway::start().await;
    let acme = gw.key("agent", "acme").await;
    let stranger = gw.key("agent", "nosuch").await;
    for _ in 0..3 {
        let (status, body) = gw.execute(&acme, "python", "print(1)", json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = gw.execute(&acme, "bash", "true", json!({})).await;
    assert_eq!(status, 200);
    let (status, _) = gw.execute(&stranger, "python", "print(1)", json!({})).await;
    assert_eq!(status, 403);

    // The candidate takes python away from acme.
    let candidate = copy_of_shipped();
    let tenants = candidate.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    data["tenants"]["acme"]["languages"] = serde_yaml_ng::from_str("[bash]").unwrap();
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();

    let config = common::test_config(gw.database_url.clone(), gw.data_dir.path());
    let (revision, report) = gateway::cli::policy::policy_replay(&config, candidate.path(), "1h")
        .await
        .unwrap();
    assert!(revision.starts_with("sha256:"));
    assert_eq!(report.total, 5, "{report:?}");
    assert_eq!(report.transition("allow->deny"), 3, "{report:?}");
    assert_eq!(report.transition("deny->allow"), 0, "{report:?}");
    assert_eq!(report.unchanged, 2, "{report:?}");
    let text = report.render(&revision, 10);
    assert!(text.contains("allow->deny: 3"), "{text}");
    assert!(text.contains("language.not_allowed"), "{text}");
    // Each changed case names its tenant and language and what changed; an allow->deny is its
    // transition only, not also a backend or limits change.
    assert!(text.contains("tenant acme, python"), "{text}");
    assert!(text.contains("outcome allow -> deny"), "{text}");
    assert_eq!(
        (report.backend_changed, report.limits_changed),
        (0, 0),
        "{report:?}"
    );
    use gateway::app::replay::{FailOn, Outcome};
    let allow_to_deny: FailOn = "allow-to-deny".parse().unwrap();
    assert_eq!(
        allow_to_deny,
        FailOn::Transition(Outcome::Allow, Outcome::Deny)
    );
    assert_eq!(report.failures(&[allow_to_deny]), 3);
    assert_eq!(report.failures(&["deny-to-allow".parse().unwrap()]), 0);

    // A candidate that lowers acme's memory: the line says which limit, from what to what.
    let lower = copy_of_shipped();
    let tenants = lower.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let was = data["tenants"]["acme"]["limits"]["memory_mb"]
        .as_u64()
        .unwrap();
    data["tenants"]["acme"]["limits"]["memory_mb"] = (was / 2).into();
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    let (revision, report) = gateway::cli::policy::policy_replay(&config, lower.path(), "1h")
        .await
        .unwrap();
    assert_eq!(report.limits_changed, 4, "{report:?}");
    assert_eq!(report.failures(&["limits".parse().unwrap()]), 4);
    assert_eq!(report.failures(&[allow_to_deny]), 0);
    let text = report.render(&revision, 10);
    let line = format!("limit memory_mb {was} -> {}", was / 2);
    assert!(text.contains(&line), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["changed"][0]["changes"][0]["change"], "limit",
        "{json}"
    );
    assert_eq!(json["changed"][0]["tenant"], "acme", "{json}");

    // The unchanged bundle changes nothing.
    let (_, same) =
        gateway::cli::policy::policy_replay(&config, &workspace_root().join("policies"), "1h")
            .await
            .unwrap();
    assert_eq!(same.unchanged, 5, "{same:?}");
    gw.stop().await;
}

/// `sandgate policy test` checks the golden decision matrix: a candidate that decides
/// differently from its `tests/decisions.out` fails, naming the changed lines, until `--bless`
/// rewrites the file.
#[test]
fn policy_test_fails_on_a_stale_decision_matrix_until_blessed() {
    use policy_engine::matrix::MatrixCheck;
    let candidate = copy_of_shipped();
    let dir = candidate.path();
    let shipped = gateway::cli::policy::policy_test(dir, false).unwrap();
    assert_eq!(shipped.matrix, MatrixCheck::Matches);
    assert!(shipped.ok(90.0));

    let tenants = dir.join("data/tenants.yaml");
    let text = std::fs::read_to_string(&tenants).unwrap();
    let mut data: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    data["tenants"]["forge"]["description"] = "unchanged decisions".into();
    data["tenants"]["acme"]["languages"] = serde_yaml_ng::from_str("[python]").unwrap();
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    let stale = gateway::cli::policy::policy_test(dir, false).unwrap();
    let MatrixCheck::Differs(changes) = &stale.matrix else {
        panic!("a stale matrix passed: {:?}", stale.matrix);
    };
    assert!(
        changes.contains("- acme bash net=- mounts=- => allow")
            && changes.contains("+ acme bash net=- mounts=- => deny"),
        "{changes}"
    );
    assert!(!stale.ok(0.0));
    let summary = stale.matrix_summary(dir);
    assert!(summary.contains("--bless"), "{summary}");

    let blessed = gateway::cli::policy::policy_test(dir, true).unwrap();
    assert_eq!(blessed.matrix, MatrixCheck::Blessed);
    let after = gateway::cli::policy::policy_test(dir, false).unwrap();
    assert_eq!(after.matrix, MatrixCheck::Matches);
}
