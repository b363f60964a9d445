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

use std::path::{Path, PathBuf};

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

/// A built candidate: its engine, the patched data files and what its tests found.
pub struct Candidate {
    pub engine: PolicyEngine,
    pub changed: Vec<SourceFile>,
    pub tests: TestEvidence,
    pub dir: PathBuf,
}

/// Builds the candidate of `base` (the base revision's files) patched with `patch` in a new
/// directory `dir`, with a copy of `tests`. With `bless`, the matrix there is rewritten.
pub fn build(
    base: &[SourceFile],
    tests: &Path,
    patch: &Map<String, Value>,
    dir: &Path,
    bless: bool,
) -> Result<Candidate, CandidateError> {
    let changed = patched_files(base, patch)?;
    write_dir(base, &changed, tests, dir).map_err(CandidateError::Io)?;
    let engine = PolicyEngine::load(dir).map_err(|err| CandidateError::Load(error_chain(&err)))?;
    let tests = run_tests(&engine, dir, bless);
    Ok(Candidate {
        engine,
        changed,
        tests,
        dir: dir.to_owned(),
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
