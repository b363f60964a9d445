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
