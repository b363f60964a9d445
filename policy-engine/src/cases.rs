//! Policy tests as data: YAML decision cases run through a loaded [`PolicyEngine`], with line
//! coverage of the bundle's Rego (what `sandgate policy test` prints, and what a reload must pass).
//!
//! A case file (every `*.yaml` / `*.yml` directly in the cases directory; anything else there, such
//! as the golden `decisions.out`, is ignored):
//!
//! ```yaml
//! entry: execution            # optional: `execution` (default), `egress` or `suggest`
//! base_input: {...}           # optional (default {}): the input every case starts from
//! cases:
//!   - name: classroom does not allow bash       # unique within the file
//!     entry: egress                             # optional: overrides the file's entry
//!     input: {principal: {tenant: classroom}}   # optional (default {}): merged over base_input
//!     expect:                                   # at least one field
//!       allow: false
//!       reasons_include: [language.not_allowed]
//! ```
//!
//! `input` is applied to `base_input` as a JSON merge patch (RFC 7386): mappings merge key by key,
//! `null` removes a key, anything else replaces the value.
//!
//! A file may carry its own data: `data: {tenants: {...}}` replaces each named top-level document
//! of the bundle's data (here `data.tenants`, whole) for that file's cases, so they do not depend
//! on the live data. The `suggest` cases do this: a proposal changes the tenants, and cases that
//! read them would fail on exactly the change the suggestion proposes.
//!
//! `expect` is matched **partially** against the decision the engine returns (after its own checks,
//! so an engine-made `policy.error` deny is what a case sees):
//! - only the fields listed are compared, and that holds inside nested mappings too
//!   (`limits: {memory_mb: 256}` checks one limit);
//! - a list is compared whole: same length, same order, every element equal (mappings inside a
//!   list compare exactly, all fields);
//! - `null` matches an absent field; numbers compare by value (`1` equals `1.0`);
//! - two extra keys check reason codes without their messages: `reason_codes: [a, b]` (exactly
//!   these codes, in this order) and `reasons_include: [a]` (at least these codes, any order).
//!
//! The fields an `expect` may name are those of the entry point's decision ([`crate::Decision`] or
//! [`crate::EgressDecision`]) plus these two; any other key (a typo) makes the file invalid.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::engine::to_regorus;
use crate::{merge_patch, PolicyEngine, PolicyError};

/// Fields of an execution decision that `expect` may name.
const EXECUTION_FIELDS: &[&str] = &[
    "allow",
    "require_approval",
    "reasons",
    "backend",
    "network",
    "mounts",
    "limits",
];
/// Fields of an egress decision that `expect` may name.
const EGRESS_FIELDS: &[&str] = &["allow", "reasons", "credentials", "upgrade"];
/// Fields of a suggestion that `expect` may name.
const SUGGEST_FIELDS: &[&str] = &["patch", "error"];
/// `expect` keys that check reason codes only.
const REASON_CODES: &str = "reason_codes";
const REASONS_INCLUDE: &str = "reasons_include";

/// The result of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseOutcome {
    /// The case file, as found under the cases directory.
    pub file: String,
    pub name: String,
    pub passed: bool,
    /// For a failed case: one block per field that differs, expected vs actual.
    pub diff: Option<String>,
}

/// Line coverage of one `.rego` file of the bundle, accumulated over every case run.
#[derive(Debug, Clone, PartialEq)]
pub struct FileCoverage {
    /// Path relative to the bundle root, as in [`PolicyEngine::files`].
    pub file: String,
    /// Lines holding code that some case evaluated.
    pub covered: Vec<u32>,
    /// Lines holding code that no case evaluated.
    pub not_covered: Vec<u32>,
}

/// What [`run_cases`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseReport {
    /// Every case, in file order then case order.
    pub outcomes: Vec<CaseOutcome>,
    /// Every `.rego` file of the bundle, sorted by path.
    pub coverage: Vec<FileCoverage>,
}

impl CaseReport {
    pub fn passed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|outcome| outcome.passed)
            .count()
    }

    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// Covered lines over all lines holding code, across every `.rego` file, in percent. A bundle
    /// without a line to cover reports 0: a threshold is never met vacuously.
    pub fn coverage_percent(&self) -> f64 {
        let (covered, total) = self.coverage.iter().fold((0, 0), |(covered, total), file| {
            (
                covered + file.covered.len(),
                total + file.covered.len() + file.not_covered.len(),
            )
        });
        percent(covered, total)
    }

    /// Human-readable report: each failure with its diff, then line coverage per file (with the
    /// lines not covered), then a final line `N passed, N failed` (newline-terminated, like every
    /// line).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for outcome in self.outcomes.iter().filter(|outcome| !outcome.passed) {
            let _ = writeln!(out, "FAIL {}: {}", outcome.file, outcome.name);
            if let Some(diff) = &outcome.diff {
                out.push_str(diff);
            }
            out.push('\n');
        }
        out.push_str("line coverage:\n");
        let width = self
            .coverage
            .iter()
            .map(|file| file.file.len())
            .max()
            .unwrap_or(0)
            .max("total".len());
        for file in &self.coverage {
            let total = file.covered.len() + file.not_covered.len();
            let _ = write!(
                out,
                "  {:width$}  {:5.1}%  ({}/{} lines)",
                file.file,
                percent(file.covered.len(), total),
                file.covered.len(),
                total,
            );
            if !file.not_covered.is_empty() {
                let _ = write!(out, "  not covered: {}", line_ranges(&file.not_covered));
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "  {:width$}  {:5.1}%",
            "total",
            self.coverage_percent()
        );
        let _ = writeln!(out, "{} passed, {} failed", self.passed(), self.failed());
        out
    }
}

fn percent(part: usize, total: usize) -> f64 {
    if total == 0 {
        return 0.0;
    }
    // Line counts are far below 2^52: the conversions are exact.
    part as f64 * 100.0 / total as f64
}

/// `3, 7-9, 12` from sorted line numbers.
fn line_ranges(lines: &[u32]) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &line in lines {
        match ranges.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(line) => *end = line,
            _ => ranges.push((line, line)),
        }
    }
    ranges
        .iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which rule a case asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    #[default]
    Execution,
    Egress,
    /// `data.sandgate.suggest`: the input is `{input, reasons}` of a past decision; the answer
    /// is `{"patch": <the suggested merge patches, or null>}`.
    Suggest,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    #[serde(default)]
    entry: Entry,
    #[serde(default = "empty_object")]
    base_input: Value,
    /// Top-level data documents that replace the bundle's for this file's cases.
    #[serde(default)]
    data: Option<Map<String, Value>>,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    entry: Option<Entry>,
    #[serde(default = "empty_object")]
    input: Value,
    expect: Map<String, Value>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// Runs every case file in `cases_dir` (e.g. `policies/tests`) against `engine` and gathers line
/// coverage over all of them. Failing cases are outcomes, not errors; the error is for a directory
/// that cannot be read, holds no case file, or a case file that is malformed (bad YAML, an unknown
/// key, an unknown `expect` field, a duplicate case name).
pub fn run_cases(engine: &PolicyEngine, cases_dir: &Path) -> Result<CaseReport, PolicyError> {
    let paths = case_files(cases_dir)?;
    if paths.is_empty() {
        return Err(PolicyError::NoCases {
            dir: cases_dir.to_path_buf(),
        });
    }
    let mut shared = engine.coverage_session();
    let mut own_data = Vec::new();
    let mut outcomes = Vec::new();
    for path in &paths {
        let file = read_case_file(path)?;
        let shown = path.display().to_string();
        let session = match &file.data {
            Some(data) => {
                own_data.push(session_with_data(engine, data).map_err(|message| {
                    PolicyError::Cases {
                        path: path.clone(),
                        message,
                    }
                })?);
                own_data.last_mut().unwrap_or(&mut shared)
            }
            None => &mut shared,
        };
        for case in file.cases {
            let entry = case.entry.unwrap_or(file.entry);
            let mut input = file.base_input.clone();
            merge_patch(&mut input, &case.input);
            let actual = decide(engine, session, entry, &input);
            let diff = diff_expect(&case.expect, &actual);
            outcomes.push(CaseOutcome {
                file: shown.clone(),
                name: case.name,
                passed: diff.is_empty(),
                diff: (!diff.is_empty()).then_some(diff),
            });
        }
    }
    own_data.push(shared);
    let coverage = coverage(engine, &own_data);
    Ok(CaseReport { outcomes, coverage })
}

/// A coverage session whose data is the bundle's with each document of `data` replaced.
fn session_with_data(
    engine: &PolicyEngine,
    data: &Map<String, Value>,
) -> Result<regorus::Engine, String> {
    let mut session = engine.coverage_session();
    let bundle = serde_json::to_value(session.get_data())
        .map_err(|err| format!("cannot read the bundle's data: {err}"))?;
    let mut merged = match bundle {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for (name, document) in data {
        merged.insert(name.clone(), document.clone());
    }
    let merged = regorus::Value::from_json_str(&Value::Object(merged).to_string())
        .map_err(|err| format!("data: {err}"))?;
    session.clear_data();
    session
        .add_data(merged)
        .map_err(|err| format!("data: {err:#}"))?;
    Ok(session)
}

/// The `*.yaml` / `*.yml` files directly in `dir` (hidden ones skipped), sorted.
fn case_files(dir: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    let read_err = |err| PolicyError::Read {
        path: dir.to_path_buf(),
        err,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let path = entry.map_err(read_err)?.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        if !name.starts_with('.')
            && (name.ends_with(".yaml") || name.ends_with(".yml"))
            && path.is_file()
        {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

fn read_case_file(path: &Path) -> Result<CaseFile, PolicyError> {
    let cases_err = |message: String| PolicyError::Cases {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|err| PolicyError::Read {
        path: path.to_path_buf(),
        err,
    })?;
    // Through YAML values first: unlike `serde_json::Value`, they refuse duplicate keys.
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|err| cases_err(err.to_string()))?;
    let json =
        serde_json::to_value(yaml).map_err(|err| cases_err(format!("not JSON-like: {err}")))?;
    let file: CaseFile = serde_json::from_value(json).map_err(|err| cases_err(err.to_string()))?;
    let mut names = BTreeSet::new();
    for case in &file.cases {
        if !names.insert(case.name.as_str()) {
            return Err(cases_err(format!("two cases are named {:?}", case.name)));
        }
        let fields = match case.entry.unwrap_or(file.entry) {
            Entry::Execution => EXECUTION_FIELDS,
            Entry::Egress => EGRESS_FIELDS,
            Entry::Suggest => SUGGEST_FIELDS,
        };
        if case.expect.is_empty() {
            return Err(cases_err(format!("case {:?} expects nothing", case.name)));
        }
        for key in case.expect.keys() {
            let known =
                fields.contains(&key.as_str()) || key == REASON_CODES || key == REASONS_INCLUDE;
            if !known {
                return Err(cases_err(format!(
                    "case {:?}: unknown expect field `{key}` (expected one of {}, {REASON_CODES}, {REASONS_INCLUDE})",
                    case.name,
                    fields.join(", ")
                )));
            }
        }
    }
    Ok(file)
}

/// The decision for one case, as JSON, through the same checks as production decisions.
fn decide(
    engine: &PolicyEngine,
    session: &mut regorus::Engine,
    entry: Entry,
    input: &Value,
) -> Value {
    let input = to_regorus(input);
    let decision = match entry {
        Entry::Execution => serde_json::to_value(engine.decide_value(input, Some(session))),
        Entry::Egress => serde_json::to_value(engine.decide_egress_value(input, Some(session))),
        Entry::Suggest => Ok(engine.suggest_value(input, Some(session))),
    };
    decision.unwrap_or_else(|err| Value::String(format!("unserializable decision: {err}")))
}

/// Empty when `actual` meets `expect`; otherwise one block per differing field.
fn diff_expect(expect: &Map<String, Value>, actual: &Value) -> String {
    let mut diff = String::new();
    for (key, expected) in expect {
        match key.as_str() {
            REASON_CODES => {
                let codes = reason_codes(actual);
                let codes = Value::Array(codes.into_iter().map(Value::String).collect());
                if !same(expected, &codes) {
                    push_diff(&mut diff, REASON_CODES, expected, &codes);
                }
            }
            REASONS_INCLUDE => {
                let codes = reason_codes(actual);
                let missing: Vec<&Value> = as_list(expected)
                    .iter()
                    .filter(|code| !code.as_str().is_some_and(|c| codes.iter().any(|a| a == c)))
                    .collect();
                if !missing.is_empty() {
                    let actual_codes = Value::Array(codes.into_iter().map(Value::String).collect());
                    push_diff(&mut diff, REASONS_INCLUDE, expected, &actual_codes);
                }
            }
            _ => diff_value(
                &mut diff,
                key,
                expected,
                actual.get(key).unwrap_or(&Value::Null),
            ),
        }
    }
    diff
}

fn as_list(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        other => std::slice::from_ref(other),
    }
}

fn reason_codes(decision: &Value) -> Vec<String> {
    decision
        .get("reasons")
        .and_then(Value::as_array)
        .map(|reasons| {
            reasons
                .iter()
                .map(|reason| match reason.get("code") {
                    Some(Value::String(code)) => code.clone(),
                    _ => String::new(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Mappings compare partially (fields of `expected` only, recursively); anything else exactly.
fn diff_value(diff: &mut String, path: &str, expected: &Value, actual: &Value) {
    if let (Value::Object(expected), Value::Object(actual)) = (expected, actual) {
        for (key, expected) in expected {
            let actual = actual.get(key).unwrap_or(&Value::Null);
            diff_value(diff, &format!("{path}.{key}"), expected, actual);
        }
    } else if !same(expected, actual) {
        push_diff(diff, path, expected, actual);
    }
}

fn push_diff(diff: &mut String, path: &str, expected: &Value, actual: &Value) {
    let _ = writeln!(
        diff,
        "  {path}:\n    expected: {expected}\n    actual:   {actual}"
    );
}

/// Exact equality, except that numbers compare by value.
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

/// Line coverage of every `.rego` file of the bundle from the session's report. regorus leaves out
/// a module no case reached; such a file counts every line holding code as not covered.
/// Several sessions (files with data of their own run on their own) count as one: a line is
/// covered when any covered it.
fn coverage(engine: &PolicyEngine, sessions: &[regorus::Engine]) -> Vec<FileCoverage> {
    let mut reported: BTreeMap<String, (BTreeSet<u32>, BTreeSet<u32>)> = BTreeMap::new();
    for report in sessions.iter().filter_map(|s| s.get_coverage_report().ok()) {
        for file in report.files {
            let lines = reported.entry(file.path).or_default();
            lines.0.extend(file.covered);
            lines.1.extend(file.not_covered);
        }
    }
    let mut files: Vec<FileCoverage> = engine
        .rego_sources()
        .into_iter()
        .map(|(rel, contents)| {
            let (covered, not_covered) = reported
                .remove(&rel)
                .map(|(covered, not_covered)| {
                    let missed = not_covered.difference(&covered).copied().collect();
                    (covered.into_iter().collect(), missed)
                })
                .unwrap_or_else(|| (Vec::new(), code_lines(&contents)));
            FileCoverage {
                file: rel,
                covered,
                not_covered,
            }
        })
        .collect();
    files.sort_by(|a, b| a.file.cmp(&b.file));
    files
}

/// Lines of a Rego file that hold code, as regorus counts them: not blank, not a comment, not
/// `package` or `import`, not only closing brackets.
fn code_lines(text: &str) -> Vec<u32> {
    (1u32..)
        .zip(text.lines())
        .filter(|(_, line)| {
            let line = line.trim();
            !(line.is_empty()
                || line.starts_with('#')
                || line.starts_with("package ")
                || line.starts_with("import ")
                || line.chars().all(|c| matches!(c, '}' | ']' | ')' | ',')))
        })
        .map(|(number, _)| number)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut base = json!({"a": {"b": 1, "c": 2}, "d": [1, 2], "e": 1});
        merge_patch(
            &mut base,
            &json!({"a": {"b": null, "x": 3}, "d": [3], "e": null}),
        );
        assert_eq!(base, json!({"a": {"c": 2, "x": 3}, "d": [3]}));
    }

    #[test]
    fn partial_matching() {
        let actual = json!({
            "allow": true, "network": null,
            "limits": {"memory_mb": 256, "cpus": 1.0},
            "reasons": [{"code": "a", "message": "m"}, {"code": "b", "message": "n"}]
        });
        let ok = |expect: Value| diff_expect(expect.as_object().unwrap(), &actual);
        assert_eq!(ok(json!({"allow": true})), "");
        assert_eq!(ok(json!({"limits": {"cpus": 1}})), "");
        assert_eq!(ok(json!({"network": null, "mounts": null})), "");
        assert_eq!(ok(json!({"reason_codes": ["a", "b"]})), "");
        assert_eq!(ok(json!({"reasons_include": ["b"]})), "");
        assert_eq!(
            ok(json!({"limits": {"memory_mb": 128}})),
            "  limits.memory_mb:\n    expected: 128\n    actual:   256\n"
        );
        // Lists compare whole, elements exactly.
        assert_ne!(ok(json!({"reasons": [{"code": "a", "message": "m"}]})), "");
        assert_ne!(ok(json!({"reasons": [{"code": "a"}, {"code": "b"}]})), "");
        assert_ne!(ok(json!({"reason_codes": ["b", "a"]})), "");
        assert_ne!(ok(json!({"reasons_include": ["c"]})), "");
        assert_ne!(ok(json!({"allow": false})), "");
    }

    #[test]
    fn line_ranges_are_compact() {
        assert_eq!(line_ranges(&[3, 7, 8, 9, 12]), "3, 7-9, 12");
        assert_eq!(line_ranges(&[]), "");
    }

    #[test]
    fn render_ends_with_the_summary_line() {
        let report = CaseReport {
            outcomes: vec![
                CaseOutcome {
                    file: "t.yaml".into(),
                    name: "good".into(),
                    passed: true,
                    diff: None,
                },
                CaseOutcome {
                    file: "t.yaml".into(),
                    name: "bad".into(),
                    passed: false,
                    diff: Some("  allow:\n    expected: true\n    actual:   false\n".into()),
                },
            ],
            coverage: vec![FileCoverage {
                file: "p.rego".into(),
                covered: vec![1, 2, 3],
                not_covered: vec![5, 6],
            }],
        };
        let text = report.render();
        assert!(text.starts_with("FAIL t.yaml: bad\n  allow:\n"), "{text}");
        assert!(
            text.contains("p.rego   60.0%  (3/5 lines)  not covered: 5-6"),
            "{text}"
        );
        assert!(text.ends_with("\n1 passed, 1 failed\n"), "{text}");
        assert_eq!(report.coverage_percent(), 60.0);
    }
}
