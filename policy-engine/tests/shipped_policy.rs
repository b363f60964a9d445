//! The bundle shipped in `policies/`, exercised through the public API: the YAML decision cases in
//! `policies/tests/` (policy tests are data), plus what the gateway relies on by name.
#![allow(
    clippy::unwrap_used,
    reason = "helpers panic like the tests using them; clippy.toml's allow-unwrap-in-tests covers only #[test] functions"
)]

use std::path::{Path, PathBuf};

use policy_engine::{Environment, PolicyEngine, PolicyInput, Principal, RequestInput};
use serde::Deserialize;
use serde_json::Value;

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn shipped() -> PolicyEngine {
    PolicyEngine::load(&policies_dir()).unwrap()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    base_input: Value,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    input: Value,
    expect: serde_json::Map<String, Value>,
}

/// JSON merge patch (RFC 7386): mappings merge key by key, `null` removes a key, anything else in
/// `patch` replaces what is in `base`.
fn merge(base: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *base = patch.clone();
        return;
    };
    if !base.is_object() {
        *base = Value::Object(serde_json::Map::new());
    }
    let Value::Object(base) = base else { return };
    for (key, value) in patch {
        if value.is_null() {
            base.remove(key);
        } else {
            merge(base.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Numbers compare by value, so `cpus: 1` in a decision equals `cpus: 1.0` in a case.
fn same(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        (a, b) => a == b,
    }
}

#[test]
fn yaml_decision_cases_pass() {
    let engine = shipped();
    let mut files: Vec<PathBuf> = std::fs::read_dir(policies_dir().join("tests"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no decision cases in policies/tests");

    let mut failures = Vec::new();
    let mut passed = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let case_file: CaseFile = serde_yaml_ng::from_str(&text).unwrap();
        for case in case_file.cases {
            let mut input = case_file.base_input.clone();
            merge(&mut input, &case.input);
            let decision = serde_json::to_value(engine.decide_json(&input)).unwrap();
            let wrong: Vec<String> = case
                .expect
                .iter()
                .filter(|(field, expected)| !same(expected, &decision[field.as_str()]))
                .map(|(field, expected)| {
                    format!(
                        "  {field}: expected {expected}, got {}",
                        decision[field.as_str()]
                    )
                })
                .collect();
            if wrong.is_empty() {
                passed += 1;
            } else {
                failures.push(format!(
                    "{}: {}\n{}",
                    file.display(),
                    case.name,
                    wrong.join("\n")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{passed} passed, {} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
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
    assert!(!unknown.allow);
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
    assert_eq!(engine.files(), ["data/tenants.yaml", "execution.rego"]);
    assert!(engine.revision().starts_with("sha256:"));
    assert_eq!(engine.revision().len(), "sha256:".len() + 64);
}
