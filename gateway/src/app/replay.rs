//! `sandgate policy replay`: re-decide the stored inputs of past decisions (executions, and
//! session openings: allowed, denied or held for review) with a
//! candidate bundle and report what would change. The blast radius of a policy change, measured
//! on real traffic before it ships.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use policy_engine::PolicyEngine;

use crate::audit::StoredDecision;

/// What a decision lets happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Allow,
    Review,
    Deny,
}

impl Outcome {
    fn of(decision: &Value) -> Outcome {
        match (
            decision["allow"].as_bool(),
            decision["require_approval"].as_bool(),
        ) {
            (Some(true), Some(true)) => Outcome::Review,
            (Some(true), _) => Outcome::Allow,
            _ => Outcome::Deny,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Review => "review",
            Outcome::Deny => "deny",
        }
    }

    fn parse(text: &str) -> Option<Outcome> {
        [Outcome::Allow, Outcome::Review, Outcome::Deny]
            .into_iter()
            .find(|outcome| outcome.as_str() == text)
    }
}

/// What a grant gives: a network destination or a mounted dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantKind {
    Network,
    Mount,
}

/// One difference between the recorded decision and the candidate's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    Outcome {
        from: Outcome,
        to: Outcome,
    },
    Backend {
        from: Option<String>,
        to: Option<String>,
    },
    /// A limit (`memory_mb`, or `network.max_bytes` of the grant) from one value to another.
    Limit {
        limit: String,
        from: Value,
        to: Value,
    },
    GrantAdded {
        kind: GrantKind,
        grant: String,
    },
    GrantRemoved {
        kind: GrantKind,
        grant: String,
    },
    /// A network rule granted before and after with other terms: its inspection, credentials
    /// or request rules (everything but its host and ports).
    RuleChanged {
        host: String,
        from: Value,
        to: Value,
    },
}

impl Change {
    fn describe(&self) -> String {
        let kind = |kind: &GrantKind| match kind {
            GrantKind::Network => "network",
            GrantKind::Mount => "mount",
        };
        match self {
            Change::Outcome { from, to } => format!("outcome {} -> {}", from.as_str(), to.as_str()),
            Change::Backend { from, to } => format!(
                "backend {} -> {}",
                from.as_deref().unwrap_or("none"),
                to.as_deref().unwrap_or("none")
            ),
            Change::Limit { limit, from, to } => format!("limit {limit} {from} -> {to}"),
            Change::GrantAdded { kind: k, grant } => format!("grant added: {} {grant}", kind(k)),
            Change::GrantRemoved { kind: k, grant } => {
                format!("grant removed: {} {grant}", kind(k))
            }
            Change::RuleChanged { host, from, to } => {
                format!("network rule for {host}: {from} -> {to}")
            }
        }
    }
}

/// What changed for one past request.
#[derive(Debug, Clone, Serialize)]
pub struct ChangedCase {
    pub execution_id: Option<String>,
    /// Set for a session opening's decision (a request of kind `session`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub at: String,
    pub tenant: String,
    pub language: String,
    /// The candidate's reason codes.
    pub reasons: Vec<String>,
    pub changes: Vec<Change>,
}

impl ChangedCase {
    fn outcome_change(&self) -> Option<(Outcome, Outcome)> {
        self.changes.iter().find_map(|change| match change {
            Change::Outcome { from, to } => Some((*from, *to)),
            _ => None,
        })
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub total: usize,
    pub unchanged: usize,
    /// Outcome transitions (`allow->deny`, `deny->review`, ...) and their counts.
    pub transitions: BTreeMap<String, usize>,
    /// The counts below are of decisions that allow before and after (an allow->deny is
    /// counted once, as its transition, not also as a backend or limits change).
    pub backend_changed: usize,
    pub network_changed: usize,
    pub limits_changed: usize,
    pub mounts_changed: usize,
    /// Candidate decisions that are `policy.error` denies.
    pub candidate_errors: usize,
    pub changed: Vec<ChangedCase>,
}

/// A kind of change that makes `sandgate policy replay --fail-on` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOn {
    /// `allow-to-deny`, `review-to-allow`, ...
    Transition(Outcome, Outcome),
    Backend,
    Network,
    Limits,
    Mounts,
    /// The candidate erred (a `policy.error` deny).
    PolicyError,
    /// Any changed decision.
    Any,
}

/// The accepted `--fail-on` values, for the error message and the docs.
pub const FAIL_ON_VALUES: &str =
    "allow-to-deny, allow-to-review, review-to-allow, review-to-deny, \
     deny-to-allow, deny-to-review, backend, network, limits, mounts, policy-error, any";

impl FromStr for FailOn {
    type Err = String;

    fn from_str(text: &str) -> Result<FailOn, String> {
        let fail_on = match text {
            "backend" => Some(FailOn::Backend),
            "network" => Some(FailOn::Network),
            "limits" => Some(FailOn::Limits),
            "mounts" => Some(FailOn::Mounts),
            "policy-error" => Some(FailOn::PolicyError),
            "any" => Some(FailOn::Any),
            _ => text.split_once("-to-").and_then(|(from, to)| {
                let (from, to) = (Outcome::parse(from)?, Outcome::parse(to)?);
                (from != to).then_some(FailOn::Transition(from, to))
            }),
        };
        fail_on
            .ok_or_else(|| format!("unknown --fail-on value {text:?}; use one of {FAIL_ON_VALUES}"))
    }
}

impl ReplayReport {
    pub fn transition(&self, name: &str) -> usize {
        self.transitions.get(name).copied().unwrap_or(0)
    }

    /// How many changed decisions match any of `fail_on`.
    pub fn failures(&self, fail_on: &[FailOn]) -> usize {
        self.changed
            .iter()
            .filter(|case| fail_on.iter().any(|rule| matches(case, *rule)))
            .count()
    }

    pub fn render(&self, candidate: &str, first: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "replayed {} decisions with candidate {candidate}",
            self.total
        );
        let _ = writeln!(out, "  unchanged: {}", self.unchanged);
        for (transition, count) in &self.transitions {
            let _ = writeln!(out, "  {transition}: {count}");
        }
        let _ = writeln!(out, "  allowed before and after, with:");
        let _ = writeln!(out, "    backend changed: {}", self.backend_changed);
        let _ = writeln!(out, "    network grant changed: {}", self.network_changed);
        let _ = writeln!(out, "    limits changed: {}", self.limits_changed);
        let _ = writeln!(out, "    mounts changed: {}", self.mounts_changed);
        let _ = writeln!(out, "  candidate policy errors: {}", self.candidate_errors);
        if !self.changed.is_empty() {
            let shown = self.changed.len().min(first);
            let _ = writeln!(out, "first {shown} of {} changed:", self.changed.len());
            for case in self.changed.iter().take(first) {
                render_case(&mut out, case);
            }
        }
        out
    }
}

fn render_case(out: &mut String, case: &ChangedCase) {
    let _ = writeln!(
        out,
        "  {} {} tenant {}, {}",
        case.at,
        case.execution_id
            .as_deref()
            .or(case.session_id.as_deref())
            .unwrap_or("-"),
        case.tenant,
        case.language
    );
    for change in &case.changes {
        let _ = writeln!(out, "    {}", change.describe());
    }
    if !case.reasons.is_empty() {
        let _ = writeln!(out, "    candidate reasons: {}", case.reasons.join(", "));
    }
}

fn matches(case: &ChangedCase, rule: FailOn) -> bool {
    let has = |wanted: fn(&Change) -> bool| case.changes.iter().any(wanted);
    match rule {
        FailOn::Any => true,
        FailOn::Transition(from, to) => case.outcome_change() == Some((from, to)),
        FailOn::Backend => has(|c| matches!(c, Change::Backend { .. })),
        FailOn::Limits => {
            has(|c| matches!(c, Change::Limit { limit, .. } if !limit.starts_with("network.")))
        }
        FailOn::Network => has(|c| {
            matches!(
                c,
                Change::GrantAdded {
                    kind: GrantKind::Network,
                    ..
                } | Change::GrantRemoved {
                    kind: GrantKind::Network,
                    ..
                } | Change::RuleChanged { .. }
            ) || matches!(c, Change::Limit { limit, .. } if limit.starts_with("network."))
        }),
        FailOn::Mounts => has(|c| {
            matches!(
                c,
                Change::GrantAdded {
                    kind: GrantKind::Mount,
                    ..
                } | Change::GrantRemoved {
                    kind: GrantKind::Mount,
                    ..
                }
            )
        }),
        FailOn::PolicyError => case
            .reasons
            .iter()
            .any(|r| r == policy_engine::POLICY_ERROR_CODE),
    }
}

/// Re-decides every stored input with `candidate` and compares with the recorded decision
/// (`sandgate policy replay`: what the candidate changes against what really happened).
pub fn replay(candidate: &PolicyEngine, stored: &[StoredDecision]) -> ReplayReport {
    replay_with(candidate, stored, |past| past.decision.clone())
}

/// Re-decides every stored input with both `base` and `candidate` and compares the two: exactly
/// what the change from `base` to `candidate` does to that traffic. A proposal's evidence uses
/// this, not [`replay`]: a recorded decision was made by whatever revision was active then, so
/// comparing with it would blame the proposal for every change approved since.
pub fn replay_between(
    base: &PolicyEngine,
    candidate: &PolicyEngine,
    stored: &[StoredDecision],
) -> ReplayReport {
    replay_with(candidate, stored, |past| decided(base, &past.input))
}

fn decided(engine: &PolicyEngine, input: &Value) -> Value {
    serde_json::to_value(engine.decide_json(input)).unwrap_or(Value::Null)
}

fn replay_with(
    candidate: &PolicyEngine,
    stored: &[StoredDecision],
    before: impl Fn(&StoredDecision) -> Value,
) -> ReplayReport {
    let mut report = ReplayReport::default();
    for past in stored {
        report.total += 1;
        let after = decided(candidate, &past.input);
        let reasons = reason_codes(&after);
        if reasons
            .iter()
            .any(|r| r == policy_engine::POLICY_ERROR_CODE)
        {
            report.candidate_errors += 1;
        }
        let changes = compare(&before(past), &after);
        if changes.is_empty() {
            report.unchanged += 1;
            continue;
        }
        count(&mut report, &changes);
        report.changed.push(ChangedCase {
            execution_id: past.execution_id.clone(),
            session_id: past.session_id.clone(),
            at: past.at.to_rfc3339(),
            tenant: past.input["principal"]["tenant"]
                .as_str()
                .unwrap_or("-")
                .to_owned(),
            language: past.input["request"]["language"]
                .as_str()
                .unwrap_or("-")
                .to_owned(),
            reasons,
            changes,
        });
    }
    report
}

/// The report's counters for one changed decision.
fn count(report: &mut ReplayReport, changes: &[Change]) {
    let (mut backend, mut network, mut limits, mut mounts) = (false, false, false, false);
    for change in changes {
        match change {
            Change::Outcome { from, to } => {
                *report
                    .transitions
                    .entry(format!("{}->{}", from.as_str(), to.as_str()))
                    .or_default() += 1;
            }
            Change::Backend { .. } => backend = true,
            Change::Limit { limit, .. } if limit.starts_with("network.") => network = true,
            Change::Limit { .. } => limits = true,
            Change::RuleChanged { .. } => network = true,
            Change::GrantAdded { kind, .. } | Change::GrantRemoved { kind, .. } => match kind {
                GrantKind::Network => network = true,
                GrantKind::Mount => mounts = true,
            },
        }
    }
    report.backend_changed += usize::from(backend);
    report.network_changed += usize::from(network);
    report.limits_changed += usize::from(limits);
    report.mounts_changed += usize::from(mounts);
}

/// The differences between two decisions. What a deny grants is nothing, so when either side
/// denies only the outcome is compared.
fn compare(before: &Value, after: &Value) -> Vec<Change> {
    let (was, now) = (Outcome::of(before), Outcome::of(after));
    let mut changes = Vec::new();
    if was != now {
        changes.push(Change::Outcome { from: was, to: now });
    }
    if was == Outcome::Deny || now == Outcome::Deny {
        return changes;
    }
    let backend = |d: &Value| d["backend"].as_str().map(str::to_owned);
    if backend(before) != backend(after) {
        changes.push(Change::Backend {
            from: backend(before),
            to: backend(after),
        });
    }
    compare_limits(&before["limits"], &after["limits"], "", &mut changes);
    compare_limits(&budget(before), &budget(after), "network.", &mut changes);
    compare_sets(
        network_grants(before),
        network_grants(after),
        GrantKind::Network,
        &mut changes,
    );
    compare_rules(&rule_terms(before), &rule_terms(after), &mut changes);
    compare_sets(
        mount_grants(before),
        mount_grants(after),
        GrantKind::Mount,
        &mut changes,
    );
    changes
}

/// Each field of two limit objects that differs, as `prefix` + its name.
fn compare_limits(before: &Value, after: &Value, prefix: &str, changes: &mut Vec<Change>) {
    let names: BTreeSet<&String> = [before, after]
        .into_iter()
        .filter_map(Value::as_object)
        .flat_map(|map| map.keys())
        .collect();
    for name in names {
        let (from, to) = (&before[name.as_str()], &after[name.as_str()]);
        if from != to {
            changes.push(Change::Limit {
                limit: format!("{prefix}{name}"),
                from: from.clone(),
                to: to.clone(),
            });
        }
    }
}

fn compare_sets(
    before: BTreeSet<String>,
    after: BTreeSet<String>,
    kind: GrantKind,
    changes: &mut Vec<Change>,
) {
    for grant in after.difference(&before) {
        changes.push(Change::GrantAdded {
            kind,
            grant: grant.clone(),
        });
    }
    for grant in before.difference(&after) {
        changes.push(Change::GrantRemoved {
            kind,
            grant: grant.clone(),
        });
    }
}

/// The network grant's budget (`max_connections`, `max_bytes`); null when it allows nothing.
fn budget(decision: &Value) -> Value {
    if network_grants(decision).is_empty() {
        return Value::Null;
    }
    let network = &decision["network"];
    serde_json::json!({
        "max_connections": network["max_connections"],
        "max_bytes": network["max_bytes"],
    })
}

/// `host:port` for every destination the decision's network grant allows.
fn network_grants(decision: &Value) -> BTreeSet<String> {
    let rules = decision["network"]["allow"]
        .as_array()
        .into_iter()
        .flatten();
    rules
        .flat_map(|rule| {
            let host = rule["host"].as_str().unwrap_or("?").to_owned();
            let ports = rule["ports"].as_array().cloned().unwrap_or_default();
            ports.into_iter().map(move |port| format!("{host}:{port}"))
        })
        .collect()
}

/// Each host's rule terms other than host and ports (`inspect`, `credentials`, `requests`, ...),
/// for hosts granted before and after.
fn compare_rules(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
    changes: &mut Vec<Change>,
) {
    for (host, from) in before {
        match after.get(host) {
            Some(to) if to != from => changes.push(Change::RuleChanged {
                host: host.clone(),
                from: from.clone(),
                to: to.clone(),
            }),
            _ => {}
        }
    }
}

/// Host -> the terms of its rule(s) besides host and ports (absent terms as absent, an
/// `inspect: false` as absent too: both mean no inspection).
fn rule_terms(decision: &Value) -> BTreeMap<String, Value> {
    let mut terms: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for rule in decision["network"]["allow"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(object) = rule.as_object() else {
            continue;
        };
        let mut rest = object.clone();
        rest.remove("host");
        rest.remove("ports");
        if rest.get("inspect") == Some(&Value::Bool(false)) {
            rest.remove("inspect");
        }
        rest.retain(|_, value| !value.is_null());
        let host = rule["host"].as_str().unwrap_or("?").to_owned();
        terms.entry(host).or_default().push(Value::Object(rest));
    }
    terms
        .into_iter()
        .map(|(host, rules)| (host, Value::Array(rules)))
        .collect()
}

/// `dataset at target (read-only|read-write)` for every mount the decision grants.
fn mount_grants(decision: &Value) -> BTreeSet<String> {
    let mounts = decision["mounts"].as_array().into_iter().flatten();
    mounts
        .map(|mount| {
            format!(
                "{} at {}{}",
                mount["dataset"].as_str().unwrap_or("?"),
                mount["target"].as_str().unwrap_or("?"),
                if mount["read_only"] == Value::Bool(false) {
                    " (read-write)"
                } else {
                    ""
                }
            )
        })
        .collect()
}

fn reason_codes(decision: &Value) -> Vec<String> {
    decision["reasons"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter_map(|r| r["code"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Parses `7d`, `24h`, `30m`, `90s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.len().saturating_sub(1);
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 7d, 24h, 30m or 90s"))?;
    let seconds = match unit {
        "d" => number.checked_mul(86_400),
        "h" => number.checked_mul(3_600),
        "m" => number.checked_mul(60),
        "s" => Some(number),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is not a duration like 7d, 24h, 30m or 90s"))?;
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn outcomes_and_fail_on_values() {
        assert_eq!(Outcome::of(&json!({"allow": true})), Outcome::Allow);
        assert_eq!(
            Outcome::of(&json!({"allow": true, "require_approval": true})),
            Outcome::Review
        );
        assert_eq!(Outcome::of(&json!({})), Outcome::Deny);
        assert_eq!(
            "allow-to-deny".parse::<FailOn>(),
            Ok(FailOn::Transition(Outcome::Allow, Outcome::Deny))
        );
        assert_eq!("limits".parse::<FailOn>(), Ok(FailOn::Limits));
        assert!("allow-to-allow".parse::<FailOn>().is_err());
        assert!("nonsense"
            .parse::<FailOn>()
            .unwrap_err()
            .contains("allow-to-deny"));
    }

    #[test]
    fn a_changed_limit_and_grant_say_what_changed_and_a_deny_is_only_its_outcome() {
        let before = json!({"allow": true, "backend": "gvisor",
            "limits": {"memory_mb": 512, "timeout_ms": 1000},
            "network": {"allow": [{"host": "a.example", "ports": [443]}],
                        "max_connections": 4, "max_bytes": 100},
            "mounts": []});
        let mut after = before.clone();
        after["limits"]["memory_mb"] = json!(256);
        after["network"]["allow"] = json!([{"host": "b.example", "ports": [443]}]);
        let changes = compare(&before, &after);
        let described: Vec<String> = changes.iter().map(Change::describe).collect();
        assert_eq!(
            described,
            [
                "limit memory_mb 512 -> 256",
                "grant added: network b.example:443",
                "grant removed: network a.example:443"
            ]
        );
        let denied = json!({"allow": false, "reasons": [{"code": "x", "message": "y"}]});
        assert_eq!(
            compare(&before, &denied),
            [Change::Outcome {
                from: Outcome::Allow,
                to: Outcome::Deny
            }]
        );
        assert!(compare(&before, &before).is_empty());
    }

    #[test]
    fn a_rule_given_credentials_or_inspection_is_a_change_of_its_grant() {
        let before = json!({"allow": true, "backend": "gvisor", "limits": {},
            "network": {"allow": [{"host": "api.example.com", "ports": [443]}],
                        "max_connections": 4, "max_bytes": 100}});
        let mut after = before.clone();
        after["network"]["allow"][0]["inspect"] = json!(true);
        after["network"]["allow"][0]["credentials"] = json!(["github"]);
        let changes = compare(&before, &after);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            matches!(&changes[0], Change::RuleChanged { host, .. } if host == "api.example.com")
        );
        assert!(matches(
            &ChangedCase {
                execution_id: None,
                session_id: None,
                at: String::new(),
                tenant: String::new(),
                language: String::new(),
                reasons: vec![],
                changes,
            },
            FailOn::Network
        ));
        // `inspect: false` and no `inspect` are the same grant.
        let mut explicit = before.clone();
        explicit["network"]["allow"][0]["inspect"] = json!(false);
        assert!(compare(&before, &explicit).is_empty());
    }
}
