//! [`PolicyEngine`]: a compiled bundle that answers `decide(&PolicyInput) -> Decision` for each
//! execution and `decide_egress(&EgressInput) -> EgressDecision` for each proxied connection.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use regorus::utils::limits::ExecutionTimerConfig;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::bundle::{self, BundleFile, FileKind, SourceFile};
use crate::{hosts, Decision, EgressDecision, EgressInput, PolicyError, PolicyInput};

/// The rule sandgate queries for every execution request.
pub const DECISION_RULE: &str = "data.sandgate.execution.decision";
/// Package and rule name of [`DECISION_RULE`], as checked at load time.
const DECISION_PACKAGE: [&str; 2] = ["sandgate", "execution"];
/// The rule the egress proxy queries for every connection attempt. A bundle need not define it;
/// without it every connection is denied with `policy.error`.
pub const EGRESS_RULE: &str = "data.sandgate.egress.decision";
const EGRESS_PACKAGE: [&str; 2] = ["sandgate", "egress"];
/// Both entry points name their rule `decision`.
const DECISION_NAME: &str = "decision";

/// Wall-clock budget of one evaluation: 50 ms. regorus checks it cooperatively between evaluation
/// steps, so a single builtin call (one huge `regex.match`) is not interrupted midway.
///
/// Builds with debug assertions (`cargo test`, `cargo run` without `--release`) allow 1 s:
/// unoptimised regorus is 10-40x slower (0.5-2 ms for the shipped policy, and p99 above 10 ms on a
/// loaded two-core machine), so 50 ms would make tests deny at random. The limit stops runaway
/// policies; it is not a latency target (`make bench` measures that, optimised).
pub const EVAL_TIME_LIMIT: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(1)
} else {
    Duration::from_millis(50)
};
/// Evaluation steps between two clock reads: small enough to stop a runaway loop within the budget,
/// large enough that a normal decision reads the clock only a handful of times.
const TIME_CHECK_INTERVAL: NonZeroU32 = match NonZeroU32::new(32) {
    Some(interval) => interval,
    None => NonZeroU32::MIN,
};

/// A loaded, compiled policy bundle. Immutable: a reload builds a new one and swaps it in.
///
/// `Send + Sync`; [`PolicyEngine::decide`] and [`PolicyEngine::decide_egress`] take `&self` and may
/// run on many threads at once. Each call clones the prepared regorus engine, which shares the
/// compiled policy and the data document behind `Arc`s, so the clone copies only empty evaluation
/// state and no lock is taken.
///
/// Both entry points are compiled once, at load, into the same prepared engine: regorus analyses,
/// schedules and hoists every rule of the bundle in one pass, and an evaluation names the rule it
/// wants, so a second engine per entry point would only double the memory.
///
/// Decisions run on regorus' interpreter. Its RVM (a bytecode VM, about 5x faster on this policy)
/// is not used: it turns an error inside a rule body into "rule undefined", so a `deny` rule that
/// hits a builtin error silently does not fire (the interpreter, in strict mode, denies), and a
/// policy with mutually recursive rules overflows the stack and aborts the process instead of
/// failing one decision. `policies/README.md` ("Keeping decisions fast") has the details.
pub struct PolicyEngine {
    prepared: regorus::Engine,
    has_egress: bool,
    revision: String,
    files: Vec<String>,
    /// The files with their contents, as the revision was computed over them.
    sources: Vec<SourceFile>,
    tenants: Vec<String>,
}

impl PolicyEngine {
    /// Loads, parses, validates and compiles the bundle in `dir` (layout: `policies/README.md`).
    ///
    /// Fails when the bundle has no policy, a file cannot be read or parsed, the data is invalid
    /// (including a host pattern that a network grant may not hold, see `policies/README.md`), the
    /// modules do not compile, or no module defines [`DECISION_RULE`]. [`EGRESS_RULE`] is optional.
    pub fn load(dir: &Path) -> Result<PolicyEngine, PolicyError> {
        let files = bundle::read_bundle(dir)?;
        if !files.iter().any(|file| file.kind == FileKind::Rego) {
            return Err(PolicyError::NoPolicies {
                dir: dir.to_path_buf(),
            });
        }
        let data = bundle::merge_data(&files)?;
        let tenants = tenant_names(&data);
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
        if !declares_rule(&engine, &DECISION_PACKAGE)? {
            return Err(PolicyError::MissingRule {
                rule: DECISION_RULE,
            });
        }
        let has_egress = declares_rule(&engine, &EGRESS_PACKAGE)?;
        if has_egress {
            // Checks the egress entry point resolves; the decision one is prepared last.
            engine
                .compile_with_entrypoint(&EGRESS_RULE.into())
                .map_err(compile_err)?;
        }
        // Analyses and schedules the modules once; clones made per decision start prepared.
        engine
            .compile_with_entrypoint(&DECISION_RULE.into())
            .map_err(compile_err)?;
        Ok(PolicyEngine {
            prepared: engine,
            has_egress,
            revision: bundle::revision(&files),
            files: files.iter().map(|file| file.rel.clone()).collect(),
            sources: files
                .into_iter()
                .map(|file| SourceFile {
                    path: file.rel,
                    contents: file.contents,
                })
                .collect(),
            tenants,
        })
    }

    /// The tenants the bundle's data names (`tenants:` keys), sorted. Key creation warns about
    /// a tenant missing here: the shipped policy denies its every request (`tenant.unknown`).
    pub fn tenants(&self) -> &[String] {
        &self.tenants
    }

    /// `sha256:<hex>` identifying the bundle's files (paths and contents); see `policies/README.md`.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Paths of the bundle's files relative to its directory, sorted.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// The bundle's files with their contents, sorted by path (what [`Self::revision`] covers).
    pub fn sources(&self) -> &[SourceFile] {
        &self.sources
    }

    /// Whether the bundle defines [`EGRESS_RULE`].
    pub fn has_egress(&self) -> bool {
        self.has_egress
    }

    /// Decides one execution request. Never fails: every problem becomes a deny with reason code
    /// `policy.error`, namely
    /// - an evaluation error, including exceeding [`EVAL_TIME_LIMIT`];
    /// - `decision` being undefined for this input;
    /// - a decision that does not deserialize strictly into [`Decision`] (unknown field, missing
    ///   `allow`, wrong type);
    /// - `allow: true` without a `backend` or without `limits`: an allow must say how to run;
    /// - a network grant with an invalid host pattern (`*`, `*.com`, a misplaced wildcard, upper
    ///   case, empty) or a host without ports or with port 0, whether or not the decision allows.
    pub fn decide(&self, input: &PolicyInput) -> Decision {
        self.decide_value(typed_to_regorus(input), None)
    }

    /// Same as [`PolicyEngine::decide`] for an input that is not (or not known to be) a
    /// [`PolicyInput`], e.g. one read from a file by `sandgate policy eval`.
    pub fn decide_json(&self, input: &serde_json::Value) -> Decision {
        self.decide_value(to_regorus(input), None)
    }

    /// Decides one connection attempt of an execution through the egress proxy. Never fails: an
    /// evaluation error, a time limit, an undefined or malformed decision, and a bundle without
    /// [`EGRESS_RULE`] are each a deny with reason code `policy.error`.
    ///
    /// The policy compares `input.connection.host` as a string: the caller canonicalises it first
    /// (lower case, no trailing dot, IDNA, dotted-quad IPv4: `egress_proxy::canonical_host`).
    pub fn decide_egress(&self, input: &EgressInput) -> EgressDecision {
        self.decide_egress_value(typed_to_regorus(input), None)
    }

    /// Same as [`PolicyEngine::decide_egress`] for a raw input (`sandgate policy eval`, dry runs).
    pub fn decide_egress_json(&self, input: &serde_json::Value) -> EgressDecision {
        self.decide_egress_value(to_regorus(input), None)
    }

    /// An evaluation engine for this bundle that records which lines run; `crate::cases`
    /// accumulates coverage over many decisions on one.
    pub(crate) fn coverage_session(&self) -> regorus::Engine {
        let mut engine = self.prepared.clone();
        engine.set_enable_coverage(true);
        engine
    }

    /// Relative path and text of every `.rego` module of the bundle.
    pub(crate) fn rego_sources(&self) -> Vec<(String, String)> {
        self.prepared
            .get_policies()
            .unwrap_or_default()
            .into_iter()
            .map(|source| (source.file().clone(), source.contents().clone()))
            .collect()
    }

    /// An execution decision, on a fresh clone of the prepared engine, or on the given session of
    /// a test run (`crate::cases`).
    pub(crate) fn decide_value(
        &self,
        input: Result<regorus::Value, String>,
        session: Option<&mut regorus::Engine>,
    ) -> Decision {
        let testing = session.is_some();
        let decision = input
            .and_then(|input| self.evaluate(DECISION_RULE, input, session))
            .and_then(|value| {
                let decision: Decision = from_regorus(&value)?;
                check_decision(&decision)?;
                Ok(decision)
            });
        decision.unwrap_or_else(|message| {
            self.log_error(DECISION_RULE, &message, testing);
            Decision::deny_with_error(message)
        })
    }

    /// An egress decision, on a fresh clone of the prepared engine, or on the given session of a
    /// test run (`crate::cases`).
    pub(crate) fn decide_egress_value(
        &self,
        input: Result<regorus::Value, String>,
        session: Option<&mut regorus::Engine>,
    ) -> EgressDecision {
        let testing = session.is_some();
        let decision = if self.has_egress {
            input.and_then(|input| {
                let value = self.evaluate(EGRESS_RULE, input.clone(), session)?;
                let decision: EgressDecision = from_regorus(&value)?;
                check_egress_credentials(&input, &decision)?;
                Ok(decision)
            })
        } else {
            Err(format!("policy bundle does not define {EGRESS_RULE}"))
        };
        decision.unwrap_or_else(|message| {
            self.log_error(EGRESS_RULE, &message, testing);
            EgressDecision::deny_with_error(message)
        })
    }

    /// Evaluates `rule`; an undefined result is an error like any other.
    fn evaluate(
        &self,
        rule: &str,
        input: regorus::Value,
        session: Option<&mut regorus::Engine>,
    ) -> Result<regorus::Value, String> {
        let value = match session {
            Some(session) => interpret(session, rule, input)?,
            None => interpret(&mut self.prepared.clone(), rule, input)?,
        };
        if value == regorus::Value::Undefined {
            return Err("decision undefined".to_string());
        }
        Ok(value)
    }

    /// A policy error is worth a warning in production; in a test case it is often the expected
    /// outcome, and the case report says so.
    fn log_error(&self, rule: &str, message: &str, testing: bool) {
        if testing {
            tracing::debug!(revision = %self.revision, rule, error = %message, "policy error in a test case, denying");
        } else {
            tracing::warn!(revision = %self.revision, rule, error = %message, "policy error, denying");
        }
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

fn timer() -> ExecutionTimerConfig {
    ExecutionTimerConfig {
        limit: EVAL_TIME_LIMIT,
        check_interval: TIME_CHECK_INTERVAL,
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
    engine.set_execution_timer_config(timer());
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

/// Whether some module of `package` declares a rule `decision`.
fn declares_rule(engine: &regorus::Engine, package: &[&str; 2]) -> Result<bool, PolicyError> {
    let packages = engine
        .get_policy_package_components()
        .map_err(compile_err)?;
    for package in packages.iter().filter(|p| p.components == package) {
        // Modules are labelled with their relative path, which is unique within the bundle.
        if engine
            .has_declared_rule_rooted_at(&package.source_file, DECISION_NAME)
            .map_err(compile_err)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A typed input as a regorus value. Through JSON text: serialising a struct to a string and parsing
/// that allocates only the regorus tree, where `serde_json::to_value` would build a second one.
fn typed_to_regorus(input: &impl Serialize) -> Result<regorus::Value, String> {
    let json = serde_json::to_string(input)
        .map_err(|err| format!("cannot encode the policy input: {err}"))?;
    regorus::Value::from_json_str(&json)
        .map_err(|err| format!("cannot encode the policy input: {err:#}"))
}

/// A raw JSON input as a regorus value.
pub(crate) fn to_regorus(input: &serde_json::Value) -> Result<regorus::Value, String> {
    regorus::Value::deserialize(input)
        .map_err(|err| format!("cannot encode the policy input: {err}"))
}

/// Evaluates `rule` on an evaluation engine.
fn interpret(
    engine: &mut regorus::Engine,
    rule: &str,
    input: regorus::Value,
) -> Result<regorus::Value, String> {
    engine.set_input(input);
    let result = engine.eval_rule(rule.to_string());
    log_prints(engine);
    result.map_err(|err| format!("evaluation failed: {err:#}"))
}

/// Reads a decision strictly (the typed decisions deny unknown fields).
fn from_regorus<T: DeserializeOwned>(value: &regorus::Value) -> Result<T, String> {
    let json =
        serde_json::to_string(value).map_err(|err| format!("cannot read the decision: {err}"))?;
    serde_json::from_str(&json).map_err(|err| format!("malformed decision: {err}"))
}

/// What the typed shape cannot say: an allow says how to run, and any grant is well-formed.
fn check_decision(decision: &Decision) -> Result<(), String> {
    if decision.allow && decision.backend.is_none() {
        return Err("decision allows but names no backend".to_string());
    }
    if decision.allow && decision.limits.is_none() {
        return Err("decision allows but sets no limits".to_string());
    }
    if let Some(grant) = &decision.network {
        hosts::validate_grant(grant)?;
    }
    Ok(())
}

/// A decision that attaches credentials may attach only those the grant lists for the host.
fn check_egress_credentials(
    input: &regorus::Value,
    decision: &EgressDecision,
) -> Result<(), String> {
    if decision.credentials.is_empty() {
        return Ok(());
    }
    let input: EgressInput = from_regorus(input)?;
    hosts::validate_credentials(&input, decision)
}

/// Forwards what the policy printed (debugging aid for policy authors) to tracing.
fn log_prints(engine: &mut regorus::Engine) {
    if let Ok(prints) = engine.take_prints() {
        for line in prints {
            tracing::debug!(target: "sandgate::policy::print", line = %line, "policy print");
        }
    }
}

/// The keys of the data's `tenants` mapping, sorted (empty when there is none).
fn tenant_names(data: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = data
        .get("tenants")
        .and_then(serde_json::Value::as_object)
        .map(|tenants| tenants.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}
