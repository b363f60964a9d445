//! [`PolicyEngine`]: a compiled bundle that answers `decide(&PolicyInput) -> Decision`.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use regorus::utils::limits::ExecutionTimerConfig;
use serde::Deserialize;

use crate::bundle::{self, BundleFile, FileKind};
use crate::{Decision, PolicyError, PolicyInput};

/// The rule sandgate queries for every execution request.
pub const DECISION_RULE: &str = "data.sandgate.execution.decision";
/// Package and rule name of [`DECISION_RULE`], as checked at load time.
const DECISION_PACKAGE: [&str; 2] = ["sandgate", "execution"];
const DECISION_NAME: &str = "decision";

/// Wall-clock budget of one evaluation. regorus checks it cooperatively between evaluation steps,
/// so a single builtin call (one huge `regex.match`) is not interrupted midway.
pub const EVAL_TIME_LIMIT: Duration = Duration::from_millis(50);
/// Evaluation steps between two clock reads: small enough to stop a runaway loop within the budget,
/// large enough that a normal decision reads the clock only a handful of times.
const TIME_CHECK_INTERVAL: NonZeroU32 = match NonZeroU32::new(32) {
    Some(interval) => interval,
    None => NonZeroU32::MIN,
};

/// A loaded, compiled policy bundle. Immutable: a reload builds a new one and swaps it in.
///
/// `Send + Sync`; [`PolicyEngine::decide`] takes `&self` and may run on many threads at once.
/// Each call clones the prepared regorus engine, which shares the compiled policy and the data
/// document behind `Arc`s, so the clone copies only empty evaluation state.
pub struct PolicyEngine {
    prepared: regorus::Engine,
    revision: String,
    files: Vec<String>,
}

impl PolicyEngine {
    /// Loads, parses and compiles the bundle in `dir` (layout: `policies/README.md`).
    pub fn load(dir: &Path) -> Result<PolicyEngine, PolicyError> {
        let files = bundle::read_bundle(dir)?;
        if !files.iter().any(|file| file.kind == FileKind::Rego) {
            return Err(PolicyError::NoPolicies {
                dir: dir.to_path_buf(),
            });
        }
        let data = bundle::merge_data(&files)?;
        let mut engine = new_engine();
        add_policies(&mut engine, &files)?;
        let data_err = |message: String| PolicyError::Data {
            path: dir.join("data"),
            message,
        };
        let data = regorus::Value::deserialize(&data).map_err(|err| data_err(err.to_string()))?;
        engine
            .add_data(data)
            .map_err(|err| data_err(format!("{err:#}")))?;
        check_decision_rule(&engine)?;
        // Analyses and schedules the modules once; clones made in `decide` start prepared.
        engine
            .compile_with_entrypoint(&DECISION_RULE.into())
            .map_err(compile_err)?;
        Ok(PolicyEngine {
            prepared: engine,
            revision: bundle::revision(&files),
            files: files.into_iter().map(|file| file.rel).collect(),
        })
    }

    /// `sha256:<hex>` identifying the bundle's files (paths and contents); see `policies/README.md`.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Paths of the bundle's files relative to its directory, sorted.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// Decides one execution request. Never fails: every problem becomes a deny with reason code
    /// `policy.error`, namely
    /// - an evaluation error, including exceeding [`EVAL_TIME_LIMIT`];
    /// - `decision` being undefined for this input;
    /// - a decision that does not deserialize strictly into [`Decision`] (unknown field, missing
    ///   `allow`, wrong type);
    /// - `allow: true` without a `backend` or without `limits`: an allow must say how to run.
    pub fn decide(&self, input: &PolicyInput) -> Decision {
        match serde_json::to_value(input) {
            Ok(input) => self.decide_json(&input),
            Err(err) => self.deny(format!("cannot encode the policy input: {err}")),
        }
    }

    /// Same as [`PolicyEngine::decide`] for an input that is not (or not known to be) a
    /// [`PolicyInput`], e.g. one read from a file by `sandgate policy eval`.
    pub fn decide_json(&self, input: &serde_json::Value) -> Decision {
        match regorus::Value::deserialize(input) {
            Ok(input) => self.decide_value(input),
            Err(err) => self.deny(format!("cannot encode the policy input: {err}")),
        }
    }

    fn decide_value(&self, input: regorus::Value) -> Decision {
        match self.evaluate(input) {
            Ok(decision) => decision,
            Err(message) => self.deny(message),
        }
    }

    fn evaluate(&self, input: regorus::Value) -> Result<Decision, String> {
        let mut engine = self.prepared.clone();
        engine.set_input(input);
        let result = engine.eval_rule(DECISION_RULE.to_string());
        log_prints(&mut engine);
        let value = result.map_err(|err| format!("evaluation failed: {err:#}"))?;
        if value == regorus::Value::Undefined {
            return Err("decision undefined".to_string());
        }
        let json = serde_json::to_string(&value)
            .map_err(|err| format!("cannot read the decision: {err}"))?;
        let decision: Decision =
            serde_json::from_str(&json).map_err(|err| format!("malformed decision: {err}"))?;
        check_allow_is_complete(&decision)?;
        Ok(decision)
    }

    fn deny(&self, message: String) -> Decision {
        tracing::warn!(revision = %self.revision, error = %message, "policy error, denying");
        Decision::deny_with_error(message)
    }
}

impl std::fmt::Debug for PolicyEngine {
    /// The compiled policy is left out: it is large and says nothing the revision does not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("revision", &self.revision)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn new_engine() -> regorus::Engine {
    let mut engine = regorus::Engine::new();
    // Rego v1 (`if`, `contains`) is regorus' default; stated here so it cannot drift.
    engine.set_rego_v0(false);
    // A failing builtin is an error (hence a deny), never a silently undefined expression that
    // could make a deny rule not fire.
    engine.set_strict_builtin_errors(true);
    // `print` output goes to tracing (see `log_prints`), never to the gateway's stderr.
    engine.set_gather_prints(true);
    engine.set_execution_timer_config(ExecutionTimerConfig {
        limit: EVAL_TIME_LIMIT,
        check_interval: TIME_CHECK_INTERVAL,
    });
    engine
}

fn add_policies(engine: &mut regorus::Engine, files: &[BundleFile]) -> Result<(), PolicyError> {
    for file in files.iter().filter(|file| file.kind == FileKind::Rego) {
        engine
            .add_policy(file.rel.clone(), file.contents.clone())
            .map_err(|err| PolicyError::Parse {
                path: file.path.clone(),
                message: format!("{err:#}"),
            })?;
    }
    Ok(())
}

fn compile_err(err: impl std::fmt::Display) -> PolicyError {
    PolicyError::Compile {
        message: format!("{err:#}"),
    }
}

/// Fails unless some module of package `sandgate.execution` declares `decision`.
fn check_decision_rule(engine: &regorus::Engine) -> Result<(), PolicyError> {
    let packages = engine
        .get_policy_package_components()
        .map_err(compile_err)?;
    for package in packages.iter().filter(|p| p.components == DECISION_PACKAGE) {
        // Modules are labelled with their relative path, which is unique within the bundle.
        if engine
            .has_declared_rule_rooted_at(&package.source_file, DECISION_NAME)
            .map_err(compile_err)?
        {
            return Ok(());
        }
    }
    Err(PolicyError::MissingRule {
        rule: DECISION_RULE,
    })
}

fn check_allow_is_complete(decision: &Decision) -> Result<(), String> {
    if decision.allow && decision.backend.is_none() {
        return Err("decision allows but names no backend".to_string());
    }
    if decision.allow && decision.limits.is_none() {
        return Err("decision allows but sets no limits".to_string());
    }
    Ok(())
}

/// Forwards what the policy printed (debugging aid for policy authors) to tracing.
fn log_prints(engine: &mut regorus::Engine) {
    if let Ok(prints) = engine.take_prints() {
        for line in prints {
            tracing::debug!(target: "sandgate::policy::print", line = %line, "policy print");
        }
    }
}
