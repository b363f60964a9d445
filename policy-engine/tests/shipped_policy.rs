//! The bundle shipped in `policies/`, exercised through the public API: the YAML decision cases in
//! `policies/tests/` (policy tests are data), plus what the gateway relies on by name.
#![allow(
    clippy::unwrap_used,
    reason = "helpers panic like the tests using them; clippy.toml's allow-unwrap-in-tests covers only #[test] functions"
)]

use std::path::{Path, PathBuf};

use policy_engine::{cases, Environment, PolicyEngine, PolicyInput, Principal, RequestInput};

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn shipped() -> PolicyEngine {
    PolicyEngine::load(&policies_dir()).unwrap()
}

/// `sandgate policy test policies --min-coverage 90`, as a test: every case passes and the cases
/// cover at least 90% of the shipped Rego's lines.
#[test]
fn yaml_decision_cases_pass_with_coverage() {
    let engine = shipped();
    let report = cases::run_cases(&engine, &policies_dir().join("tests")).unwrap();
    let rendered = report.render();
    println!("{rendered}");
    assert!(report.outcomes.len() >= 40, "{rendered}");
    assert_eq!(report.failed(), 0, "{rendered}");
    assert!(report.coverage_percent() >= 90.0, "{rendered}");
    // Both entry points and the suggestions are covered, file by file.
    let files: Vec<&str> = report.coverage.iter().map(|f| f.file.as_str()).collect();
    assert_eq!(files, ["egress.rego", "execution.rego", "suggest.rego"]);
    assert!(rendered.ends_with(&format!("\n{} passed, 0 failed\n", report.passed())));
}

fn typed_input(tenant: &str, language: &str) -> PolicyInput {
    PolicyInput {
        principal: Principal {
            key_id: "key_1".into(),
            tenant: tenant.into(),
            role: "agent".into(),
        },
        request: RequestInput {
            language: language.into(),
            code_bytes: 8,
            ..RequestInput::default()
        },
        environment: Environment {
            backends: vec!["gvisor".into(), "runc".into()],
            datasets: vec![],
            now: "2025-01-01T00:00:00Z".into(),
        },
    }
}

/// The gateway's README example and end-to-end tests depend on these by name.
#[test]
fn tenants_the_gateway_tests_rely_on() {
    let engine = shipped();
    for language in ["python", "bash"] {
        let decision = engine.decide(&typed_input("acme", language));
        assert!(decision.allow, "acme/{language}: {decision:?}");
        assert_eq!(decision.backend.as_deref(), Some("gvisor"));
        assert!(decision.limits.is_some());
        assert!(decision.reasons.is_empty());
    }

    let unknown = engine.decide(&typed_input("nosuch", "python"));
    assert!(!unknown.allow, "{unknown:?}");
    assert_eq!(unknown.reasons.len(), 1, "{unknown:?}");
    assert_eq!(unknown.reasons[0].code, "tenant.unknown");

    let no_bash = engine.decide(&typed_input("classroom", "bash"));
    assert!(!no_bash.allow);
    assert_eq!(no_bash.reasons[0].code, "language.not_allowed");
    assert!(no_bash.reasons[0].message.contains("bash"));
    assert!(no_bash.reasons[0].message.contains("classroom"));
}

#[test]
fn bundle_lists_policy_and_data_but_not_tests_or_docs() {
    let engine = shipped();
    assert_eq!(
        engine.files(),
        [
            "data/tenants.yaml",
            "egress.rego",
            "execution.rego",
            "suggest.rego"
        ]
    );
    assert!(engine.has_egress());
    assert!(engine.revision().starts_with("sha256:"));
    assert_eq!(engine.revision().len(), "sha256:".len() + 64);
}

/// A copy of the shipped bundle with `patch` (a JSON merge patch) applied to data/tenants.yaml,
/// as an approved proposal writes it.
fn shipped_with(patch: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["", "data", "tests"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(policies_dir().join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                let target = dir.path().join(sub).join(path.file_name().unwrap());
                std::fs::copy(&path, target).unwrap();
            }
        }
    }
    let tenants = dir.path().join("data/tenants.yaml");
    let text = std::fs::read_to_string(&tenants).unwrap();
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut document = serde_json::to_value(yaml).unwrap();
    policy_engine::merge_patch(&mut document, patch);
    std::fs::write(&tenants, serde_yaml_ng::to_string(&document).unwrap()).unwrap();
    dir
}

/// The shipped cases do not pin what a suggestion for a shipped tenant would change: approving
/// the suggestions an agent's access-request opens (classroom may mount census, run ruby, reach
/// a host; a raised limit) leaves every case passing, so such a proposal can be approved.
#[test]
fn the_shipped_cases_pass_after_the_suggestions_for_shipped_tenants_are_applied() {
    let patches = [
        serde_json::json!({"tenants": {"classroom": {"datasets": ["census"]}}}),
        serde_json::json!({"tenants": {"classroom": {"languages": ["python", "ruby"]}}}),
        serde_json::json!({"tenants": {"research": {"network": {"allow": [
            {"host": "*.census.gov", "ports": [443]}, {"host": "data.example.org", "ports": [443]}]}}}}),
        serde_json::json!({"tenants": {"acme": {"network": {"allow": [
            {"host": "pypi.org", "ports": [443]}, {"host": "files.pythonhosted.org", "ports": [443]},
            {"host": "api.example.com", "ports": [443]}]}}}}),
        serde_json::json!({"tenants": {"classroom": {"limits": {"memory_mb": 1024}}}}),
    ];
    for patch in patches {
        let dir = shipped_with(&patch);
        let engine = PolicyEngine::load(dir.path()).unwrap();
        let report = cases::run_cases(&engine, &dir.path().join("tests")).unwrap();
        let rendered = report.render();
        let suggest: Vec<_> = report
            .outcomes
            .iter()
            .filter(|o| o.file.ends_with("suggest.yaml") || o.file.ends_with("reasons.yaml"))
            .collect();
        assert!(suggest.len() >= 10, "{rendered}");
        assert!(
            suggest.iter().all(|o| o.passed),
            "after {patch}:\n{rendered}"
        );
        if patch["tenants"]["classroom"]["datasets"].is_array() {
            assert_eq!(report.failed(), 0, "after {patch}:\n{rendered}");
        }
    }
}
