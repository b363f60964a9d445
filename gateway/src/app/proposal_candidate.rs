//! A proposal's candidate bundle: the base revision's files with a JSON merge patch applied to
//! each named data file, written into a directory of its own with the base's `tests/`, loaded
//! and tested there. Blocking (file system and the engine): callers run it off the async threads.
//!
//! A patch may only name data files of the base bundle (`data/*.yaml`); a patched file is
//! written back as YAML (its comments are not kept). The candidate must load and compile, or the
//! proposal is refused with the engine's message. Its YAML cases decide whether it may be
//! approved; its golden matrix (`tests/decisions.out`) is compared and the difference shown:
//! a data change is expected to change decisions, so approving rewrites the matrix with the
//! candidate's decisions (what `sandgate policy test --bless` does with a hand edit).

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use policy_engine::{matrix, PolicyEngine, SourceFile};

use super::error_chain;

/// Why a candidate could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CandidateError {
    #[error("{0}")]
    Patch(String),
    /// The patched bundle does not load or compile: the engine's message.
    #[error("the patched bundle does not load: {0}")]
    Load(String),
    #[error("cannot write the candidate bundle: {0}")]
    Io(String),
}

/// What the candidate's tests found.
#[derive(Debug, Clone, Serialize)]
pub struct TestEvidence {
    pub passed: bool,
    pub cases_passed: usize,
    pub cases_failed: usize,
    pub coverage_percent: f64,
    /// The failing cases as `sandgate policy test` prints them (empty when all pass).
    pub failures: String,
    /// `matches`, `differs` or `absent`.
    pub matrix: &'static str,
    /// The matrix lines that change (`- old`, `+ new`).
    pub matrix_diff: String,
}

/// A built candidate: its engine, the patched data files and what its tests found, in its own
/// directory (removed when the candidate is dropped, whatever path drops it).
pub struct Candidate {
    pub engine: PolicyEngine,
    pub changed: Vec<SourceFile>,
    pub tests: TestEvidence,
    pub dir: tempfile::TempDir,
}

impl Candidate {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What applying it writes into the policy directory: the patched data files and, when
    /// the bundle has one, the golden matrix (rewritten when built with `bless`).
    pub fn files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = self
            .changed
            .iter()
            .map(|file| (file.path.clone(), file.contents.clone().into_bytes()))
            .collect();
        if let Ok(bytes) = std::fs::read(self.path().join(matrix::MATRIX_FILE)) {
            files.push((matrix::MATRIX_FILE.to_owned(), bytes));
        }
        files
    }
}

/// Builds the candidate of `base` (the base revision's files) patched with `patch` in `dir`
/// (new and empty), with a copy of `tests`. With `bless`, the matrix there is rewritten.
pub fn build(
    base: &[SourceFile],
    tests: &Path,
    patch: &Map<String, Value>,
    dir: tempfile::TempDir,
    bless: bool,
) -> Result<Candidate, CandidateError> {
    let changed = patched_files(base, patch)?;
    write_dir(base, &changed, tests, dir.path()).map_err(CandidateError::Io)?;
    let engine =
        PolicyEngine::load(dir.path()).map_err(|err| CandidateError::Load(error_chain(&err)))?;
    let tests = run_tests(&engine, dir.path(), bless);
    Ok(Candidate {
        engine,
        changed,
        tests,
        dir,
    })
}

/// The data files `patch` names, each patched. Names outside the base's data are refused.
pub fn patched_files(
    base: &[SourceFile],
    patch: &Map<String, Value>,
) -> Result<Vec<SourceFile>, CandidateError> {
    if patch.is_empty() {
        return Err(CandidateError::Patch(
            "the patch changes no file".to_owned(),
        ));
    }
    let data: Vec<&SourceFile> = base.iter().filter(|f| is_data_file(&f.path)).collect();
    let mut changed = Vec::new();
    for (path, change) in patch {
        let Some(file) = data.iter().find(|file| file.path == *path) else {
            let known: Vec<&str> = data.iter().map(|f| f.path.as_str()).collect();
            return Err(CandidateError::Patch(format!(
                "{path:?} is not a data file of the bundle (data files: {})",
                known.join(", ")
            )));
        };
        let contents = patch_yaml(&file.contents, change)
            .map_err(|err| CandidateError::Patch(format!("{path}: {err}")))?;
        changed.push(SourceFile {
            path: path.clone(),
            contents,
        });
    }
    Ok(changed)
}

fn is_data_file(path: &str) -> bool {
    path.starts_with("data/") && (path.ends_with(".yaml") || path.ends_with(".yml"))
}

fn patch_yaml(contents: &str, change: &Value) -> Result<String, String> {
    let parsed: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(contents).map_err(|err| err.to_string())?;
    let mut document = serde_json::to_value(parsed).map_err(|err| err.to_string())?;
    policy_engine::merge_patch(&mut document, change);
    let header = "# Written by sandgate from an approved policy proposal (a JSON merge patch).\n";
    let body = serde_yaml_ng::to_string(&document).map_err(|err| err.to_string())?;
    Ok(format!("{header}{body}"))
}

fn write_dir(
    base: &[SourceFile],
    changed: &[SourceFile],
    tests: &Path,
    dir: &Path,
) -> Result<(), String> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |err: std::io::Error| format!("{path}: {err}")
    };
    for file in base {
        let contents = changed
            .iter()
            .find(|c| c.path == file.path)
            .map_or(&file.contents, |c| &c.contents);
        let rel = super::policy_upload::plain_relative(Path::new(&file.path))
            .ok_or_else(|| format!("odd file name {:?}", file.path))?;
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, contents).map_err(io(&path))?;
    }
    copy_tree(tests, &dir.join("tests")).map_err(io(tests))
}

/// Copies the regular files of a directory tree (symbolic links are not followed).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    std::fs::create_dir_all(to)?;
    for entry in entries {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// The candidate's YAML cases and golden matrix, as `sandgate policy test` runs them.
fn run_tests(engine: &PolicyEngine, dir: &Path, bless: bool) -> TestEvidence {
    let mut evidence = TestEvidence {
        passed: false,
        cases_passed: 0,
        cases_failed: 0,
        coverage_percent: 0.0,
        failures: String::new(),
        matrix: "absent",
        matrix_diff: String::new(),
    };
    match policy_engine::cases::run_cases(engine, &dir.join("tests")) {
        Ok(report) => {
            evidence.cases_failed = report.failed();
            evidence.cases_passed = report.outcomes.len() - report.failed();
            evidence.coverage_percent = report.coverage_percent();
            evidence.passed = report.failed() == 0;
            if !evidence.passed {
                evidence.failures = report.render();
            }
        }
        Err(err) => evidence.failures = format!("cannot run the cases: {}", error_chain(&err)),
    }
    match matrix::check(engine, dir, bless) {
        Ok(matrix::MatrixCheck::Differs(diff)) => {
            evidence.matrix = "differs";
            evidence.matrix_diff = diff;
        }
        Ok(matrix::MatrixCheck::Absent) => evidence.matrix = "absent",
        Ok(_) => evidence.matrix = "matches",
        Err(err) => evidence.matrix_diff = format!("cannot check the matrix: {err}"),
    }
    evidence
}

/// The tenants' data file, whose `tenants.<name>.limits` a suggestion may raise.
const TENANTS_FILE: &str = "data/tenants.yaml";

/// Caps each limit a suggestion raises (`data/tenants.yaml` → `tenants.<t>.limits.<name>`) at
/// the gateway's ceiling of that name: a request asking for more than any sandbox may get must
/// not become a tenant's limit. A raise that the cap brings to or below the tenant's current
/// limit is dropped, and so is what it leaves empty (an empty patch: no suggestion).
pub fn cap_limits(
    patch: &mut Map<String, Value>,
    base: &[SourceFile],
    ceilings: &crate::config::Ceilings,
) {
    let Some(tenants) = patch
        .get_mut(TENANTS_FILE)
        .and_then(|file| file.get_mut("tenants"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let current = current_tenants(base);
    for (name, change) in tenants.iter_mut() {
        let Some(limits) = change.get_mut("limits").and_then(Value::as_object_mut) else {
            continue;
        };
        let now = &current[name.as_str()]["limits"];
        limits.retain(
            |limit, value| match (ceiling(ceilings, limit), value.as_f64()) {
                (Some(ceiling), Some(asked)) => {
                    let capped = asked.min(ceiling);
                    *value = number(capped, value);
                    now[limit.as_str()].as_f64().is_none_or(|now| capped > now)
                }
                // Not a limit the gateway bounds (or not a number): not suggested.
                _ => false,
            },
        );
        if limits.is_empty() {
            if let Some(change) = change.as_object_mut() {
                change.remove("limits");
            }
        }
    }
    tenants.retain(|_, change| change.as_object().is_none_or(|c| !c.is_empty()));
    if tenants.is_empty() {
        patch.remove(TENANTS_FILE);
    }
}

fn current_tenants(base: &[SourceFile]) -> Value {
    base.iter()
        .find(|file| file.path == TENANTS_FILE)
        .and_then(|file| serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&file.contents).ok())
        .and_then(|parsed| serde_json::to_value(parsed).ok())
        .map(|data| data["tenants"].clone())
        .unwrap_or(Value::Null)
}

fn ceiling(ceilings: &crate::config::Ceilings, limit: &str) -> Option<f64> {
    let value = match limit {
        "timeout_ms" => ceilings.timeout_ms,
        "memory_mb" => ceilings.memory_mb,
        "cpus" => return Some(ceilings.cpus),
        "pids" => ceilings.pids,
        "disk_mb" => ceilings.disk_mb,
        "output_bytes" => ceilings.output_bytes,
        _ => return None,
    };
    Some(value as f64)
}

/// `capped` as JSON, an integer when the asked value was one.
fn number(capped: f64, asked: &Value) -> Value {
    if asked.is_f64() {
        Value::from(capped)
    } else {
        Value::from(capped as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suggested_limit_is_capped_at_the_ceiling_and_dropped_when_not_a_raise() {
        let base = vec![SourceFile {
            path: TENANTS_FILE.to_owned(),
            contents: "tenants:\n  lab:\n    limits: {timeout_ms: 5000, memory_mb: 4096}\n"
                .to_owned(),
        }];
        let ceilings = crate::config::Ceilings::default();
        let mut patch: Map<String, Value> = serde_json::from_value(serde_json::json!({
            TENANTS_FILE: {"tenants": {"lab": {"limits": {
                "timeout_ms": 999_999_999u64, "memory_mb": 999_999u64, "cpus": 64.0, "odd": 1}}}}
        }))
        .unwrap();
        cap_limits(&mut patch, &base, &ceilings);
        assert_eq!(
            Value::Object(patch),
            serde_json::json!({TENANTS_FILE: {"tenants": {"lab": {"limits": {
                "timeout_ms": ceilings.timeout_ms, "cpus": ceilings.cpus}}}}})
        );
        let mut only_memory: Map<String, Value> = serde_json::from_value(serde_json::json!({
            TENANTS_FILE: {"tenants": {"lab": {"limits": {"memory_mb": 999_999u64}}}}
        }))
        .unwrap();
        cap_limits(&mut only_memory, &base, &ceilings);
        assert!(only_memory.is_empty(), "{only_memory:?}");
    }
}
