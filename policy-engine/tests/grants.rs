//! Network grants are checked twice: every grant a decision returns (a bad one is a `policy.error`
//! deny), and every host pattern in the bundle's data (a bad one fails the load, so a reload keeps
//! the previous bundle instead of denying in production).
#![allow(
    clippy::unwrap_used,
    reason = "helpers panic like the tests using them; clippy.toml's allow-unwrap-in-tests covers only #[test] functions"
)]

use policy_engine::{Decision, PolicyEngine, PolicyError, PolicyInput};
use tempfile::TempDir;

const LIMITS: &str = r#"{"timeout_ms": 1000, "memory_mb": 64, "cpus": 0.5, "pids": 64, "disk_mb": 16, "output_bytes": 4096}"#;

fn bundle(files: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new().unwrap();
    for (rel, contents) in files {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

/// The decision of a policy that allows with `allow` as its network grant's host rules.
fn decide_with_grant(allow: &str, allowed: bool) -> Decision {
    let rego = format!(
        "package sandgate.execution\ndecision := {{\"allow\": {allowed}, \"backend\": \"gvisor\", \"limits\": {LIMITS}, \
         \"network\": {{\"allow\": {allow}, \"max_connections\": 4, \"max_bytes\": 1024}}}}\n"
    );
    let dir = bundle(&[("p.rego", &rego)]);
    PolicyEngine::load(dir.path())
        .unwrap()
        .decide(&PolicyInput::default())
}

#[test]
fn good_grants_pass_through() {
    let decision = decide_with_grant(
        r#"[{"host": "pypi.org", "ports": [443]}, {"host": "*.pythonhosted.org", "ports": [443, 8443]}, {"host": "10.1.2.3", "ports": [5432]}]"#,
        true,
    );
    assert!(decision.allow, "{decision:?}");
    assert_eq!(decision.network.unwrap().allow.len(), 3);
    assert!(decide_with_grant("[]", true).allow);
}

#[test]
fn bad_grants_are_policy_errors_even_in_a_deny() {
    for (allow, needle) in [
        (
            r#"[{"host": "*", "ports": [443]}]"#,
            "would match every host",
        ),
        (r#"[{"host": "*.com", "ports": [443]}]"#, "too broad"),
        (r#"[{"host": "", "ports": [443]}]"#, "is empty"),
        (
            r#"[{"host": "a.*.example.com", "ports": [443]}]"#,
            "wildcard",
        ),
        (r#"[{"host": "*example.com", "ports": [443]}]"#, "wildcard"),
        (r#"[{"host": "PyPI.org", "ports": [443]}]"#, "lower case"),
        (r#"[{"host": "pypi.org.", "ports": [443]}]"#, "empty label"),
        (r#"[{"host": "pypi.org", "ports": [0]}]"#, "port 0"),
        (r#"[{"host": "pypi.org", "ports": []}]"#, "no ports"),
        (
            r#"[{"host": "pypi.org", "ports": [443]}, {"host": "*.org", "ports": [443]}]"#,
            "too broad",
        ),
    ] {
        for allowed in [true, false] {
            let decision = decide_with_grant(allow, allowed);
            assert!(!decision.allow, "{allow}: {decision:?}");
            assert_eq!(decision.reasons.len(), 1, "{allow}: {decision:?}");
            assert_eq!(decision.reasons[0].code, "policy.error");
            let message = &decision.reasons[0].message;
            assert!(message.contains("invalid network grant"), "{message}");
            assert!(message.contains(needle), "{allow}: {message}");
            assert_eq!(decision.network, None);
        }
    }
}

fn load_with_data(yaml: &str) -> Result<PolicyEngine, PolicyError> {
    let dir = bundle(&[
        (
            "p.rego",
            "package sandgate.execution\ndecision := {\"allow\": false}\n",
        ),
        ("data/tenants.yaml", yaml),
    ]);
    PolicyEngine::load(dir.path())
}

#[test]
fn bad_host_patterns_in_data_fail_the_load() {
    for (yaml, needle) in [
        (
            "tenants:\n  acme:\n    network:\n      allow:\n        - {host: pypi.org, ports: [443]}\n        - {host: '*', ports: [443]}\n",
            "tenants.acme.network.allow[1].host: host pattern \"*\" would match every host",
        ),
        (
            "tenants:\n  acme:\n    network:\n      allow: [{host: '*.com', ports: [443]}]\n",
            "too broad",
        ),
        (
            "tenants:\n  acme:\n    network:\n      allow: [{host: PyPI.org, ports: [443]}]\n",
            "lower case",
        ),
        (
            "tenants:\n  acme:\n    network:\n      allow: [{host: pypi.org, ports: [0]}]\n",
            "tenants.acme.network.allow[0].ports",
        ),
        ("mirrors:\n  hosts: [pypi.org, '*.org']\n", "mirrors.hosts[1]: host pattern \"*.org\""),
    ] {
        let err = load_with_data(yaml).err().unwrap();
        assert!(matches!(err, PolicyError::Data { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("data/tenants.yaml"), "{message}");
        assert!(message.contains(needle), "{yaml}: {message}");
    }
}

#[test]
fn good_host_patterns_in_data_load() {
    let engine = load_with_data(
        "tenants:\n  acme:\n    network:\n      allow:\n        - {host: pypi.org, ports: [443]}\n        - {host: '*.pythonhosted.org', ports: [443]}\n\
         mirrors:\n  hosts: [pypi.org, '*.example.org']\n",
    );
    assert!(engine.is_ok(), "{engine:?}");
}

#[test]
fn the_shipped_data_passes_its_own_checks() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    assert!(PolicyEngine::load(&dir).is_ok());
}
