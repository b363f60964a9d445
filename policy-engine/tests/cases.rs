//! `cases::run_cases` against small bundles: case file format, partial matching, diffs, coverage
//! and the errors for malformed case files.
#![allow(
    clippy::unwrap_used,
    reason = "helpers panic like the tests using them; clippy.toml's allow-unwrap-in-tests covers only #[test] functions"
)]

use policy_engine::cases::{run_cases, CaseReport};
use policy_engine::{PolicyEngine, PolicyError};
use tempfile::TempDir;

const EXECUTION: &str = r#"package sandgate.execution

decision := {"allow": true, "backend": "gvisor", "limits": limits, "reasons": []} if {
	input.tenant == "acme"
}

decision := {"allow": false, "reasons": [{"code": "tenant.unknown", "message": "who?"}, {"code": "z.other", "message": "m"}]} if {
	input.tenant != "acme"
}

limits := {"timeout_ms": 1000, "memory_mb": 64, "cpus": 0.5, "pids": 64, "disk_mb": 16, "output_bytes": 4096}
"#;

const EGRESS: &str = r#"package sandgate.egress

decision := {"allow": input.connection.host == "pypi.org"}
"#;

/// Never reached by any case: its lines count as not covered.
const UNUSED: &str = r#"package sandgate.unused

# a comment
x := 1

y := 2 if {
	input.a == 1
}
"#;

fn bundle(cases: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new().unwrap();
    let files = [
        ("execution.rego", EXECUTION),
        ("egress.rego", EGRESS),
        ("lib/unused.rego", UNUSED),
    ];
    for (rel, contents) in files.iter().chain(cases) {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

fn run(dir: &TempDir) -> Result<CaseReport, PolicyError> {
    let engine = PolicyEngine::load(dir.path()).unwrap();
    run_cases(&engine, &dir.path().join("tests"))
}

const GOOD: &str = r#"
base_input: {tenant: acme}
cases:
  - name: whole decision
    expect:
      allow: true
      require_approval: false
      reasons: []
      backend: gvisor
      network: null
      mounts: []
      limits: {timeout_ms: 1000, memory_mb: 64, cpus: 0.5, pids: 64, disk_mb: 16, output_bytes: 4096}
  - name: nested mappings match partially, numbers by value
    expect: {limits: {cpus: 0.5, timeout_ms: 1000.0}}
  - name: reason codes without messages
    input: {tenant: other}
    expect: {allow: false, reason_codes: [tenant.unknown, z.other], reasons_include: [z.other]}
  - name: a merge patch can remove a key
    input: {tenant: null}
    expect: {reasons_include: [policy.error]}
  - name: a case may ask the egress rule
    entry: egress
    input: {connection: {host: pypi.org}}
    expect: {allow: true, reasons: []}
"#;

#[test]
fn passing_cases_and_coverage() {
    let dir = bundle(&[
        ("tests/good.yaml", GOOD),
        (
            "tests/egress.yml",
            "entry: egress\ncases:\n  - name: denied\n    input: {connection: {host: evil.example}}\n    expect: {allow: false}\n",
        ),
        // Not case files: ignored.
        ("tests/decisions.out", "acme python => allow\n"),
        ("tests/README.md", "# notes\n"),
        ("tests/.swap.yaml", "not: [yaml"),
    ]);
    let report = run(&dir).unwrap();
    assert_eq!(
        (report.passed(), report.failed()),
        (6, 0),
        "{}",
        report.render()
    );
    let names: Vec<&str> = report.outcomes.iter().map(|o| o.name.as_str()).collect();
    // Files in name order, cases in file order.
    assert_eq!(names[0], "denied");
    assert!(report.outcomes[0].file.ends_with("tests/egress.yml"));
    assert_eq!(names[1], "whole decision");

    let files: Vec<&str> = report.coverage.iter().map(|f| f.file.as_str()).collect();
    assert_eq!(files, ["egress.rego", "execution.rego", "lib/unused.rego"]);
    let unused = &report.coverage[2];
    assert!(unused.covered.is_empty());
    // Code lines of a file no case reached: `x := 1`, the rule's head and its body.
    assert_eq!(unused.not_covered, [4, 6, 7]);
    let percent = report.coverage_percent();
    assert!(percent > 0.0 && percent < 100.0, "{percent}");

    let text = report.render();
    assert!(!text.contains("FAIL"), "{text}");
    assert!(text.contains("lib/unused.rego"), "{text}");
    assert!(text.contains("not covered: 4, 6-7"), "{text}");
    assert!(text.ends_with("\n6 passed, 0 failed\n"), "{text}");
}

#[test]
fn failing_cases_show_a_diff_per_field() {
    let dir = bundle(&[(
        "tests/bad.yaml",
        r#"
base_input: {tenant: acme}
cases:
  - name: wrong in two places
    expect: {allow: false, limits: {memory_mb: 128, cpus: 0.5}}
  - name: lists compare whole
    input: {tenant: other}
    expect: {reasons: [{code: tenant.unknown, message: "who?"}]}
  - name: missing reason code
    input: {tenant: other}
    expect: {reasons_include: [language.not_allowed]}
  - name: passes
    expect: {allow: true}
"#,
    )]);
    let report = run(&dir).unwrap();
    assert_eq!((report.passed(), report.failed()), (1, 3));
    let first = report.outcomes[0].diff.as_deref().unwrap();
    assert_eq!(
        first,
        "  allow:\n    expected: false\n    actual:   true\n  limits.memory_mb:\n    expected: 128\n    actual:   64\n"
    );
    let text = report.render();
    assert!(text.starts_with("FAIL "), "{text}");
    assert!(
        text.contains("bad.yaml: wrong in two places\n  allow:\n"),
        "{text}"
    );
    assert!(
        text.contains("bad.yaml: lists compare whole\n  reasons:\n"),
        "{text}"
    );
    assert!(
        text.contains("  reasons_include:\n    expected: [\"language.not_allowed\"]\n    actual:   [\"tenant.unknown\",\"z.other\"]"),
        "{text}"
    );
    assert!(!text.contains("FAIL bad.yaml: passes"), "{text}");
    assert!(text.ends_with("\n1 passed, 3 failed\n"), "{text}");
}

#[test]
fn malformed_case_files_are_errors() {
    for (yaml, needle) in [
        ("cases:\n  - name: a\n    expect: {alow: true}\n", "unknown expect field `alow`"),
        ("entry: egress\ncases:\n  - name: a\n    expect: {backend: gvisor}\n", "unknown expect field `backend`"),
        ("cases:\n  - name: a\n    expect: {}\n", "expects nothing"),
        (
            "cases:\n  - name: a\n    expect: {allow: true}\n  - name: a\n    expect: {allow: true}\n",
            "two cases are named \"a\"",
        ),
        ("cases:\n  - name: a\n    expect: {allow: true}\n    inputs: {}\n", "unknown field `inputs`"),
        ("entry: policy\ncases: []\n", "unknown variant `policy`"),
        ("cases:\n  - {name: a, expect: {allow: true}, input: {a: 1, a: 2}}\n", "duplicate"),
        ("cases: [unclosed\n", "invalid case file"),
    ] {
        let dir = bundle(&[("tests/x.yaml", yaml)]);
        let err = run(&dir).unwrap_err();
        assert!(matches!(err, PolicyError::Cases { .. }), "{yaml}: {err:?}");
        let message = err.to_string();
        assert!(message.contains("x.yaml"), "{message}");
        assert!(message.contains(needle), "{yaml}: {message}");
    }
}

#[test]
fn a_cases_dir_without_case_files_is_an_error() {
    let dir = bundle(&[("tests/decisions.out", "x\n")]);
    assert!(matches!(run(&dir), Err(PolicyError::NoCases { .. })));
    let dir = bundle(&[]);
    assert!(matches!(run(&dir), Err(PolicyError::Read { .. })));
}

const DATA_EXECUTION: &str = r#"package sandgate.execution

decision := {"allow": true, "backend": "gvisor", "limits": limits, "reasons": []} if {
	input.tenant in data.allowed
}

decision := {"allow": false, "reasons": [{"code": "tenant.unknown", "message": "who?"}]} if {
	not input.tenant in data.allowed
}

limits := {"timeout_ms": 1000, "memory_mb": 64, "cpus": 0.5, "pids": 64, "disk_mb": 16, "output_bytes": 4096}
"#;

/// A file's `data` replaces those documents of the bundle's data for its cases only; the other
/// files read the bundle's; coverage counts the lines either reached.
#[test]
fn a_file_with_its_own_data_does_not_read_the_bundles() {
    let dir = TempDir::new().unwrap();
    let files = [
        ("execution.rego", DATA_EXECUTION),
        ("egress.rego", EGRESS),
        ("data/allowed.yaml", "allowed: [acme]\n"),
        (
            "tests/own.yaml",
            "data: {allowed: [forge]}\ncases:\n  - name: forge, from the file's data\n    \
             input: {tenant: forge}\n    expect: {allow: true}\n  - name: acme is not in it\n    \
             input: {tenant: acme}\n    expect: {allow: false}\n",
        ),
        (
            "tests/live.yaml",
            "cases:\n  - name: acme, from the bundle's data\n    input: {tenant: acme}\n    \
             expect: {allow: true}\n",
        ),
    ];
    for (rel, contents) in files {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    let report = run(&dir).unwrap();
    let rendered = report.render();
    assert_eq!(report.failed(), 0, "{rendered}");
    assert_eq!(report.passed(), 3, "{rendered}");
    let execution = report
        .coverage
        .iter()
        .find(|f| f.file == "execution.rego")
        .unwrap();
    // Both decisions ran (one in each session): every line of both is covered.
    assert!(execution.not_covered.is_empty(), "{rendered}");
}
