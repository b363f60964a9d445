//! `decide_egress`: the shipped `sandgate.egress` policy through the typed API, and the fail-closed
//! cases (no egress rule, malformed decisions, evaluation errors).
#![allow(
    clippy::unwrap_used,
    reason = "helpers panic like the tests using them; clippy.toml's allow-unwrap-in-tests covers only #[test] functions"
)]

use std::path::Path;

use policy_engine::{
    Connection, EgressDecision, EgressExecution, EgressInput, HostRule, NetworkGrant, PolicyEngine,
};
use tempfile::TempDir;

fn shipped() -> PolicyEngine {
    PolicyEngine::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")).unwrap()
}

fn grant(rules: &[(&str, &[u16])]) -> NetworkGrant {
    NetworkGrant {
        allow: rules
            .iter()
            .map(|(host, ports)| HostRule::new(*host, ports.to_vec()))
            .collect(),
        max_connections: 8,
        max_bytes: 1 << 20,
        max_denied: None,
        max_denied_per_s: None,
    }
}

fn connect(grant: NetworkGrant, host: &str, port: u16) -> EgressInput {
    EgressInput {
        execution: EgressExecution {
            id: "ex_1".into(),
            tenant: "acme".into(),
            grant,
        },
        connection: Connection {
            host: host.into(),
            port,
            scheme: "https".into(),
            method: None,
            path: None,
            query: None,
            headers: None,
            upgrade: None,
        },
    }
}

fn codes(decision: &EgressDecision) -> Vec<&str> {
    decision.reasons.iter().map(|r| r.code.as_str()).collect()
}

fn assert_policy_error(decision: &EgressDecision, needle: &str) {
    assert!(!decision.allow, "{decision:?}");
    assert_eq!(codes(decision), ["policy.error"], "{decision:?}");
    assert!(
        decision.reasons[0].message.contains(needle),
        "expected {needle:?} in {:?}",
        decision.reasons[0].message
    );
}

#[test]
fn shipped_policy_matches_exact_hosts_and_wildcards_on_label_boundaries() {
    let engine = shipped();
    let grant = grant(&[("pypi.org", &[443]), ("*.example.com", &[443, 8443])]);
    for (host, port, allow, code) in [
        ("pypi.org", 443, true, None),
        ("pypi.org", 80, false, Some("egress.port_not_granted")),
        ("www.pypi.org", 443, false, Some("egress.host_not_granted")),
        ("a.example.com", 443, true, None),
        ("a.b.example.com", 8443, true, None),
        ("a.example.com", 22, false, Some("egress.port_not_granted")),
        ("example.com", 443, false, Some("egress.host_not_granted")),
        (
            "badexample.com",
            443,
            false,
            Some("egress.host_not_granted"),
        ),
        (
            "example.com.evil.org",
            443,
            false,
            Some("egress.host_not_granted"),
        ),
        (".example.com", 443, false, Some("egress.host_not_granted")),
        (
            "169.254.169.254",
            80,
            false,
            Some("egress.host_not_granted"),
        ),
    ] {
        let decision = engine.decide_egress(&connect(grant.clone(), host, port));
        assert_eq!(decision.allow, allow, "{host}:{port}: {decision:?}");
        assert_eq!(
            codes(&decision),
            code.into_iter().collect::<Vec<_>>(),
            "{host}:{port}"
        );
    }
}

#[test]
fn shipped_policy_reasons_name_the_host_and_the_granted_ports() {
    let engine = shipped();
    let decision = engine.decide_egress(&connect(grant(&[("pypi.org", &[443])]), "pypi.org", 80));
    assert_eq!(
        decision.reasons[0].message,
        "pypi.org is granted to execution ex_1 on ports [443], not 80"
    );
    let decision = engine.decide_egress(&connect(grant(&[]), "evil.example", 443));
    assert_eq!(
        decision.reasons[0].message,
        "evil.example is not granted to execution ex_1"
    );
}

#[test]
fn plain_http_fields_reach_the_policy_only_when_present() {
    let dir = bundle(
        r#"decision := {"allow": false, "reasons": [{"code": "echo", "message": json.marshal(input.connection)}]}"#,
    );
    let engine = PolicyEngine::load(dir.path()).unwrap();
    let mut input = connect(grant(&[]), "pypi.org", 443);
    let seen = engine.decide_egress(&input).reasons[0].message.clone();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
        serde_json::json!({"host": "pypi.org", "port": 443, "scheme": "https"})
    );
    input.connection.scheme = "http".into();
    input.connection.method = Some("GET".into());
    input.connection.path = Some("/simple/".into());
    let seen = engine.decide_egress(&input).reasons[0].message.clone();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
        serde_json::json!({"host": "pypi.org", "port": 443, "scheme": "http", "method": "GET", "path": "/simple/"})
    );
}

/// A bundle with the shipped execution policy's minimum and `egress_rego` in package
/// `sandgate.egress`.
fn bundle(egress_rego: &str) -> TempDir {
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("execution.rego"),
        "package sandgate.execution\ndecision := {\"allow\": false}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("egress.rego"),
        format!("package sandgate.egress\n{egress_rego}\n"),
    )
    .unwrap();
    dir
}

#[test]
fn bundle_without_an_egress_rule_loads_and_denies_every_connection() {
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("execution.rego"),
        "package sandgate.execution\ndecision := {\"allow\": false}\n",
    )
    .unwrap();
    let engine = PolicyEngine::load(dir.path()).unwrap();
    assert!(!engine.has_egress());
    let decision = engine.decide_egress(&connect(grant(&[("pypi.org", &[443])]), "pypi.org", 443));
    assert_policy_error(&decision, "does not define data.sandgate.egress.decision");
}

#[test]
fn egress_failures_deny_with_policy_error() {
    let input = connect(grant(&[("pypi.org", &[443])]), "pypi.org", 443);
    for (rego, needle) in [
        (
            r#"decision := {"allow": true, "extra": 1}"#,
            "unknown field `extra`",
        ),
        (r#"decision := {"reasons": []}"#, "missing field `allow`"),
        (r#"decision := {"allow": "yes"}"#, "invalid type"),
        (
            r#"decision := {"allow": true} if input.connection.port == 1"#,
            "decision undefined",
        ),
        (
            r#"decision := {"allow": to_number(input.connection.host) > 1}"#,
            "evaluation failed",
        ),
    ] {
        let engine = PolicyEngine::load(bundle(rego).path()).unwrap();
        assert!(engine.has_egress());
        assert_policy_error(&engine.decide_egress(&input), needle);
    }
}

#[test]
fn raw_egress_inputs_are_decided_too() {
    let engine = shipped();
    let decision = engine.decide_egress_json(&serde_json::json!({
        "execution": {"id": "ex_1", "tenant": "acme",
                      "grant": {"allow": [{"host": "pypi.org", "ports": [443]}], "max_connections": 1, "max_bytes": 1}},
        "connection": {"host": "pypi.org", "port": 443, "scheme": "https"}
    }));
    assert!(decision.allow, "{decision:?}");
    // Without the connection's host the policy cannot decide: a deny, never an allow.
    let decision =
        engine.decide_egress_json(&serde_json::json!({"execution": {}, "connection": {}}));
    assert_policy_error(&decision, "decision undefined");
}

#[test]
fn the_execution_rule_is_still_required() {
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("egress.rego"),
        "package sandgate.egress\ndecision := {\"allow\": false}\n",
    )
    .unwrap();
    let err = PolicyEngine::load(dir.path()).unwrap_err();
    assert!(
        matches!(err, policy_engine::PolicyError::MissingRule { .. }),
        "{err:?}"
    );
}
