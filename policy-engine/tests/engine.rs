//! `PolicyEngine` against small bundles written for each test: loading, the input/decision
//! mapping, fail-closed evaluation, revisions and concurrency. Latency is measured by
//! `benches/decide.rs` (`make bench`).
#![allow(
    clippy::unwrap_used,
    reason = "helpers panic like the tests using them; clippy.toml's allow-unwrap-in-tests covers only #[test] functions"
)]

use std::path::Path;
use std::time::Instant;

use policy_engine::{
    Decision, Environment, HostPort, Limits, PolicyEngine, PolicyError, PolicyInput, Principal,
    RequestInput, RequestedLimits, EVAL_TIME_LIMIT,
};
use tempfile::TempDir;

const PACKAGE: &str = "package sandgate.execution\n";

const LIMITS: &str = r#"{"timeout_ms": 1000, "memory_mb": 64, "cpus": 0.5, "pids": 64, "disk_mb": 16, "output_bytes": 4096}"#;

/// A bundle directory holding `files` (relative path, contents).
fn bundle(files: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new().unwrap();
    write(dir.path(), files);
    dir
}

fn write(root: &Path, files: &[(&str, &str)]) {
    for (rel, contents) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
}

/// An engine whose only rule is `decision := <decision_rego>`.
fn engine_deciding(decision_rego: &str) -> PolicyEngine {
    let dir = bundle(&[("p.rego", &format!("{PACKAGE}decision := {decision_rego}\n"))]);
    PolicyEngine::load(dir.path()).unwrap()
}

fn input() -> PolicyInput {
    PolicyInput {
        principal: Principal {
            key_id: "key_1".into(),
            tenant: "acme".into(),
            role: "agent".into(),
        },
        request: RequestInput {
            language: "python".into(),
            code_sha256: "ab".repeat(32),
            code_bytes: 8,
            network: vec![HostPort {
                host: "pypi.org".into(),
                port: 443,
            }],
            limits: RequestedLimits {
                timeout_ms: Some(5000),
                ..RequestedLimits::default()
            },
            ..RequestInput::default()
        },
        environment: Environment {
            backends: vec!["gvisor".into()],
            datasets: vec!["census".into()],
            now: "2025-01-01T00:00:00Z".into(),
        },
    }
}

/// Asserts a `policy.error` deny whose message contains `needle`.
fn assert_policy_error(decision: &Decision, needle: &str) {
    assert!(!decision.allow, "{decision:?}");
    assert_eq!(decision.reasons.len(), 1, "{decision:?}");
    assert_eq!(decision.reasons[0].code, "policy.error");
    assert!(
        decision.reasons[0].message.contains(needle),
        "expected {needle:?} in {:?}",
        decision.reasons[0].message
    );
    assert_eq!(decision.backend, None);
    assert_eq!(decision.limits, None);
}

// ---- input and decision mapping ----

#[test]
fn full_decision_maps_onto_the_typed_struct() {
    let engine = engine_deciding(&format!(
        r#"{{
            "allow": true, "require_approval": true,
            "reasons": [{{"code": "network.host_not_allowed", "message": "m"}}],
            "backend": "gvisor",
            "network": {{"allow": [{{"host": "*.pythonhosted.org", "ports": [443]}}],
                        "max_connections": 32, "max_bytes": 104857600}},
            "mounts": [{{"dataset": "census", "target": "/data/census", "read_only": true}}],
            "limits": {LIMITS}
        }}"#
    ));
    let decision = engine.decide(&input());
    let expected: Decision = serde_json::from_value(serde_json::json!({
        "allow": true, "require_approval": true,
        "reasons": [{"code": "network.host_not_allowed", "message": "m"}],
        "backend": "gvisor",
        "network": {"allow": [{"host": "*.pythonhosted.org", "ports": [443]}],
                    "max_connections": 32, "max_bytes": 104857600u64},
        "mounts": [{"dataset": "census", "target": "/data/census", "read_only": true}],
        "limits": {"timeout_ms": 1000, "memory_mb": 64, "cpus": 0.5, "pids": 64, "disk_mb": 16, "output_bytes": 4096}
    }))
    .unwrap();
    assert_eq!(decision, expected);
    assert_eq!(
        decision.limits,
        Some(Limits {
            timeout_ms: 1000,
            memory_mb: 64,
            cpus: 0.5,
            pids: 64,
            disk_mb: 16,
            output_bytes: 4096
        })
    );
}

#[test]
fn minimal_deny_needs_only_allow() {
    let decision = engine_deciding(r#"{"allow": false}"#).decide(&input());
    assert!(!decision.allow);
    assert!(!decision.require_approval);
    assert!(decision.reasons.is_empty());
    assert_eq!(decision.network, None);
    assert!(decision.mounts.is_empty());
}

#[test]
fn policy_sees_the_input_as_documented() {
    // The policy echoes its input back through a reason message.
    let engine = engine_deciding(
        r#"{"allow": false, "reasons": [{"code": "echo", "message": json.marshal(input)}]}"#,
    );
    let decision = engine.decide(&input());
    let seen: serde_json::Value = serde_json::from_str(&decision.reasons[0].message).unwrap();
    assert_eq!(seen, serde_json::to_value(input()).unwrap());
    assert_eq!(seen["principal"]["tenant"], "acme");
    assert_eq!(seen["request"]["network"][0]["port"], 443);
    // Limits the client did not set are absent, not null.
    assert_eq!(
        seen["request"]["limits"],
        serde_json::json!({"timeout_ms": 5000})
    );
}

#[test]
fn unknown_field_in_decision_denies() {
    let decision =
        engine_deciding(r#"{"allow": true, "backend": "gvisor", "extra": 1}"#).decide(&input());
    assert_policy_error(&decision, "unknown field `extra`");
}

#[test]
fn unknown_field_in_nested_decision_object_denies() {
    let decision = engine_deciding(
        r#"{"allow": false, "reasons": [{"code": "c", "message": "m", "severity": "high"}]}"#,
    )
    .decide(&input());
    assert_policy_error(&decision, "unknown field `severity`");
}

#[test]
fn missing_allow_denies() {
    let decision = engine_deciding(r#"{"backend": "gvisor"}"#).decide(&input());
    assert_policy_error(&decision, "missing field `allow`");
}

#[test]
fn wrong_type_denies() {
    let decision = engine_deciding(r#"{"allow": "yes"}"#).decide(&input());
    assert_policy_error(&decision, "invalid type");
    let decision = engine_deciding(r#"true"#).decide(&input());
    assert_policy_error(&decision, "malformed decision");
    let decision = engine_deciding(&format!(
        r#"{{"allow": true, "backend": "gvisor", "limits": object.union({LIMITS}, {{"pids": -1}})}}"#
    ))
    .decide(&input());
    assert_policy_error(&decision, "invalid value");
}

#[test]
fn undefined_decision_denies() {
    let engine = engine_deciding(r#"{"allow": true} if input.principal.role == "admin""#);
    assert_policy_error(&engine.decide(&input()), "decision undefined");
}

#[test]
fn allow_without_backend_or_limits_denies() {
    let no_backend = engine_deciding(&format!(r#"{{"allow": true, "limits": {LIMITS}}}"#));
    assert_policy_error(&no_backend.decide(&input()), "no backend");
    let no_limits = engine_deciding(r#"{"allow": true, "backend": "gvisor"}"#);
    assert_policy_error(&no_limits.decide(&input()), "no limits");
    let complete = engine_deciding(&format!(
        r#"{{"allow": true, "backend": "gvisor", "limits": {LIMITS}}}"#
    ));
    assert!(complete.decide(&input()).allow);
}

#[test]
fn evaluation_error_denies() {
    let engine = engine_deciding(r#"{"allow": to_number(input.principal.tenant) > 1}"#);
    assert_policy_error(&engine.decide(&input()), "evaluation failed");
}

#[test]
fn runaway_evaluation_hits_the_time_limit_and_denies() {
    // About 10^9 loop iterations: minutes without a limit.
    let engine = engine_deciding(
        r#"{"allow": false, "reasons": [{"code": "x", "message": sprintf("%d", [n])}]} if {
            n := count([1 | some a in numbers.range(1, 1000); some b in numbers.range(1, 1000); some c in numbers.range(1, 1000)])
        }"#,
    );
    let started = Instant::now();
    let decision = engine.decide(&input());
    let elapsed = started.elapsed();
    assert_policy_error(&decision, "time limit");
    assert!(elapsed >= EVAL_TIME_LIMIT, "{elapsed:?}");
    assert!(elapsed < EVAL_TIME_LIMIT * 4, "took {elapsed:?}");
}

#[test]
fn decide_json_takes_raw_inputs() {
    let engine = engine_deciding(
        r#"{"allow": false, "reasons": [{"code": "c", "message": input.anything}]}"#,
    );
    let decision = engine.decide_json(&serde_json::json!({"anything": "goes"}));
    assert_eq!(decision.reasons[0].message, "goes");
    assert_policy_error(
        &engine.decide_json(&serde_json::json!({})),
        "decision undefined",
    );
}

#[test]
fn deny_with_error_shape() {
    let decision = Decision::deny_with_error("boom");
    assert_eq!(
        serde_json::to_value(&decision).unwrap(),
        serde_json::json!({
            "allow": false, "require_approval": false,
            "reasons": [{"code": "policy.error", "message": "boom"}],
            "backend": null, "network": null, "mounts": [], "limits": null
        })
    );
}

// ---- loading ----

#[test]
fn empty_dir_is_a_load_error() {
    let dir = bundle(&[]);
    assert!(matches!(
        PolicyEngine::load(dir.path()),
        Err(PolicyError::NoPolicies { .. })
    ));
}

#[test]
fn policies_only_under_tests_is_a_load_error() {
    let dir = bundle(&[("tests/p.rego", &format!("{PACKAGE}decision := {{}}\n"))]);
    assert!(matches!(
        PolicyEngine::load(dir.path()),
        Err(PolicyError::NoPolicies { .. })
    ));
}

#[test]
fn missing_dir_is_a_read_error() {
    let dir = bundle(&[]);
    let err = PolicyEngine::load(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(err, PolicyError::Read { .. }), "{err:?}");
}

#[test]
fn syntax_error_is_a_parse_error_naming_the_file() {
    let dir = bundle(&[("bad.rego", &format!("{PACKAGE}decision := {{\"allow\": \n"))]);
    let err = PolicyEngine::load(dir.path()).unwrap_err();
    assert!(matches!(err, PolicyError::Parse { .. }), "{err:?}");
    assert!(err.to_string().contains("bad.rego"), "{err}");
}

#[test]
fn rego_v0_syntax_is_a_parse_error() {
    let dir = bundle(&[(
        "v0.rego",
        &format!("{PACKAGE}decision = {{\"allow\": false}} {{ true }}\n"),
    )]);
    let err = PolicyEngine::load(dir.path()).unwrap_err();
    assert!(matches!(err, PolicyError::Parse { .. }), "{err:?}");
}

#[test]
fn semantic_errors_are_compile_errors() {
    for body in [
        // A variable used but never bound.
        "decision := x if { y == 1 }",
        // A function defined with two different arities.
        "f(x) := 1\nf(x, y) := 2\ndecision := f(1)",
    ] {
        let dir = bundle(&[("p.rego", &format!("{PACKAGE}{body}\n"))]);
        let err = PolicyEngine::load(dir.path()).unwrap_err();
        assert!(
            matches!(err, PolicyError::Compile { .. }),
            "{body}: {err:?}"
        );
    }
}

/// regorus resolves these only while evaluating, so they load; they must then deny.
#[test]
fn errors_regorus_finds_only_at_evaluation_deny() {
    for body in [
        "decision := {\"allow\": no_such_function(1)}",
        "decision := {\"allow\": count(1, 2) > 0}",
        "decision := {\"allow\": false}\ndecision := {\"allow\": true}",
        "a := b\nb := a\ndecision := {\"allow\": a}",
    ] {
        let dir = bundle(&[("p.rego", &format!("{PACKAGE}{body}\n"))]);
        let engine = PolicyEngine::load(dir.path()).unwrap();
        assert_policy_error(&engine.decide(&input()), "evaluation failed");
    }
}

#[test]
fn bundle_without_the_decision_rule_is_a_load_error() {
    let dir = bundle(&[
        (
            "other.rego",
            "package sandgate.egress\ndecision := {\"allow\": false}\n",
        ),
        (
            "exec.rego",
            &format!("{PACKAGE}decisions := {{\"allow\": false}}\n"),
        ),
    ]);
    let err = PolicyEngine::load(dir.path()).unwrap_err();
    assert!(matches!(err, PolicyError::MissingRule { .. }), "{err:?}");
}

#[test]
fn data_files_are_merged_into_data() {
    let dir = bundle(&[
        (
            "p.rego",
            &format!(
                "{PACKAGE}decision := {{\"allow\": false, \"reasons\": [{{\"code\": data.a.code, \"message\": data.b.nested.message}}]}}\n"
            ),
        ),
        ("data/a.yaml", "a: {code: from_a}\n"),
        ("data/more/b.yml", "b:\n  nested:\n    message: from_b\n"),
        ("data/comments-only.yaml", "# nothing yet\n"),
        ("data/notes.txt", "not data"),
        ("not-data/c.yaml", "c: 1\n"),
    ]);
    let engine = PolicyEngine::load(dir.path()).unwrap();
    let decision = engine.decide(&input());
    assert_eq!(decision.reasons[0].code, "from_a");
    assert_eq!(decision.reasons[0].message, "from_b");
    assert_eq!(
        engine.files(),
        [
            "data/a.yaml",
            "data/comments-only.yaml",
            "data/more/b.yml",
            "p.rego"
        ]
    );
}

#[test]
fn conflicting_data_keys_are_a_load_error() {
    let dir = bundle(&[
        (
            "p.rego",
            &format!("{PACKAGE}decision := {{\"allow\": false}}\n"),
        ),
        ("data/a.yaml", "tenants: {acme: {}}\n"),
        ("data/b.yaml", "tenants: {other: {}}\n"),
    ]);
    let err = PolicyEngine::load(dir.path()).unwrap_err();
    assert!(matches!(err, PolicyError::Data { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("`tenants` is already defined in data/a.yaml"),
        "{err}"
    );
}

#[test]
fn malformed_data_is_a_load_error() {
    for contents in [
        "- a list\n",
        "a: [unclosed\n",
        "just a string\n",
        // Duplicate keys, which a JSON-style parse would silently collapse to the last one.
        "a: 1\na: 2\n",
        "tenants:\n  acme: {languages: [python]}\n  acme: {languages: [bash]}\n",
        // A key that JSON cannot hold.
        "? [a, b]\n: composite key\n",
    ] {
        let dir = bundle(&[
            (
                "p.rego",
                &format!("{PACKAGE}decision := {{\"allow\": false}}\n"),
            ),
            ("data/d.yaml", contents),
        ]);
        let err = PolicyEngine::load(dir.path()).unwrap_err();
        assert!(
            matches!(err, PolicyError::Data { .. }),
            "{contents:?}: {err:?}"
        );
    }
}

#[test]
fn hidden_files_and_tests_are_not_part_of_the_bundle() {
    let dir = bundle(&[
        (
            "p.rego",
            &format!("{PACKAGE}decision := {{\"allow\": false}}\n"),
        ),
        (".#p.rego", "editor lock file, not rego"),
        (".git/x.rego", "not rego"),
        ("tests/cases.yaml", "cases: []\n"),
        ("tests/x.rego", "not rego"),
        ("README.md", "docs"),
    ]);
    let engine = PolicyEngine::load(dir.path()).unwrap();
    assert_eq!(engine.files(), ["p.rego"]);
}

#[test]
fn symlinked_files_are_followed_and_dangling_links_outside_the_bundle_ignored() {
    let real = bundle(&[(
        "exec.rego",
        &format!("{PACKAGE}decision := {{\"allow\": false}}\n"),
    )]);
    let dir = bundle(&[]);
    // A Kubernetes ConfigMap volume looks like this: visible names are links into `..data/`.
    std::os::unix::fs::symlink(real.path().join("exec.rego"), dir.path().join("exec.rego"))
        .unwrap();
    std::os::unix::fs::symlink("/nonexistent", dir.path().join("README.md")).unwrap();
    let engine = PolicyEngine::load(dir.path()).unwrap();
    assert_eq!(engine.files(), ["exec.rego"]);
}

// ---- revision ----

#[test]
fn revision_depends_only_on_bundle_files() {
    let files = [
        (
            "p.rego",
            format!("{PACKAGE}decision := {{\"allow\": false}}\n"),
        ),
        ("data/t.yaml", "t: 1\n".to_string()),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
    let a = bundle(&files);
    let b = bundle(&files);
    let rev_a = PolicyEngine::load(a.path()).unwrap().revision().to_string();
    assert_eq!(rev_a, PolicyEngine::load(b.path()).unwrap().revision());
    assert_eq!(rev_a, PolicyEngine::load(a.path()).unwrap().revision());

    // Files outside the bundle do not count.
    write(
        b.path(),
        &[("README.md", "docs"), ("tests/c.yaml", "cases: []\n")],
    );
    assert_eq!(rev_a, PolicyEngine::load(b.path()).unwrap().revision());

    // One changed byte of data does.
    write(b.path(), &[("data/t.yaml", "t: 2\n")]);
    let rev_b = PolicyEngine::load(b.path()).unwrap().revision().to_string();
    assert_ne!(rev_a, rev_b);

    // So does a renamed file with the same contents.
    std::fs::rename(a.path().join("p.rego"), a.path().join("q.rego")).unwrap();
    assert_ne!(rev_a, PolicyEngine::load(a.path()).unwrap().revision());
}

#[test]
fn revision_is_the_documented_manifest_hash() {
    use sha2::{Digest, Sha256};
    let rego = format!("{PACKAGE}decision := {{\"allow\": false}}\n");
    let dir = bundle(&[("p.rego", &rego), ("data/t.yaml", "t: 1\n")]);
    let mut manifest = String::new();
    for (rel, contents) in [("data/t.yaml", "t: 1\n"), ("p.rego", rego.as_str())] {
        let digest = hex::encode(Sha256::digest(contents.as_bytes()));
        manifest.push_str(&format!("{rel}\0{digest}\n"));
    }
    let expected = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(manifest.as_bytes()))
    );
    assert_eq!(PolicyEngine::load(dir.path()).unwrap().revision(), expected);
}

// ---- concurrency and latency ----

#[test]
fn engine_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PolicyEngine>();

    let engine =
        PolicyEngine::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")).unwrap();
    let mut acme = input();
    acme.request.network.clear();
    let mut nosuch = acme.clone();
    nosuch.principal.tenant = "nosuch".into();
    let expected = [engine.decide(&acme), engine.decide(&nosuch)];
    assert!(expected[0].allow && !expected[1].allow);
    // Few iterations: a debug build decides in about a millisecond.
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (engine, acme, nosuch, expected) = (&engine, &acme, &nosuch, &expected);
            scope.spawn(move || {
                for i in 0..25 {
                    let which = (thread + i) % 2;
                    let decision = engine.decide(if which == 0 { acme } else { nosuch });
                    assert_eq!(decision, expected[which]);
                }
            });
        }
    });
}
