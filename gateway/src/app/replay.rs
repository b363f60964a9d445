//! `sandgate policy replay`: re-decide the stored inputs of past execution decisions with a
//! candidate bundle and report what would change. The blast radius of a policy change, measured
//! on real traffic before it ships.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use policy_engine::PolicyEngine;

use crate::audit::StoredDecision;

/// What changed for one past request.
#[derive(Debug, Clone)]
pub struct ChangedCase {
    pub execution_id: Option<String>,
    pub at: String,
    pub before: String,
    pub after: String,
    pub changes: Vec<&'static str>,
}

#[derive(Debug, Clone, Default)]
pub struct ReplayReport {
    pub total: usize,
    pub unchanged: usize,
    /// Outcome transitions (`allow->deny`, `deny->review`, ...) and their counts.
    pub transitions: BTreeMap<String, usize>,
    pub backend_changed: usize,
    pub network_changed: usize,
    pub limits_changed: usize,
    pub mounts_changed: usize,
    /// Candidate decisions that are `policy.error` denies.
    pub candidate_errors: usize,
    pub changed: Vec<ChangedCase>,
}

impl ReplayReport {
    pub fn transition(&self, name: &str) -> usize {
        self.transitions.get(name).copied().unwrap_or(0)
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
        let _ = writeln!(out, "  backend changed: {}", self.backend_changed);
        let _ = writeln!(out, "  network grant changed: {}", self.network_changed);
        let _ = writeln!(out, "  limits changed: {}", self.limits_changed);
        let _ = writeln!(out, "  mounts changed: {}", self.mounts_changed);
        let _ = writeln!(out, "  candidate policy errors: {}", self.candidate_errors);
        if !self.changed.is_empty() {
            let shown = self.changed.len().min(first);
            let _ = writeln!(out, "first {shown} of {} changed:", self.changed.len());
            for case in self.changed.iter().take(first) {
                let _ = writeln!(
                    out,
                    "  {} {} [{}]\n    before: {}\n    after:  {}",
                    case.at,
                    case.execution_id.as_deref().unwrap_or("-"),
                    case.changes.join(", "),
                    case.before,
                    case.after
                );
            }
        }
        out
    }
}

/// Re-decides every stored input with `candidate`.
pub fn replay(candidate: &PolicyEngine, stored: &[StoredDecision]) -> ReplayReport {
    let mut report = ReplayReport::default();
    for past in stored {
        report.total += 1;
        let after = serde_json::to_value(candidate.decide_json(&past.input)).unwrap_or(Value::Null);
        let before = &past.decision;
        if has_reason(&after, policy_engine::POLICY_ERROR_CODE) {
            report.candidate_errors += 1;
        }
        let mut changes = Vec::new();
        let (was, now) = (outcome(before), outcome(&after));
        if was != now {
            *report
                .transitions
                .entry(format!("{was}->{now}"))
                .or_default() += 1;
            changes.push("outcome");
        }
        for (field, counter, label) in [
            ("backend", &mut report.backend_changed, "backend"),
            ("network", &mut report.network_changed, "network"),
            ("limits", &mut report.limits_changed, "limits"),
            ("mounts", &mut report.mounts_changed, "mounts"),
        ] {
            if normalized(before, field) != normalized(&after, field) {
                *counter += 1;
                changes.push(label);
            }
        }
        if changes.is_empty() {
            report.unchanged += 1;
        } else {
            report.changed.push(ChangedCase {
                execution_id: past.execution_id.clone(),
                at: past.at.to_rfc3339(),
                before: summary(before),
                after: summary(&after),
                changes,
            });
        }
    }
    report
}

fn outcome(decision: &Value) -> &'static str {
    match (
        decision["allow"].as_bool(),
        decision["require_approval"].as_bool(),
    ) {
        (Some(true), Some(true)) => "review",
        (Some(true), _) => "allow",
        _ => "deny",
    }
}

/// A field, with absent, null and empty treated alike (older decisions omit empty fields).
fn normalized(decision: &Value, field: &str) -> Value {
    match &decision[field] {
        Value::Array(items) if items.is_empty() => Value::Null,
        Value::Object(map) if map.is_empty() => Value::Null,
        Value::Object(map)
            if field == "network" && map["allow"].as_array().is_some_and(Vec::is_empty) =>
        {
            Value::Null
        }
        other => other.clone(),
    }
}

fn has_reason(decision: &Value, code: &str) -> bool {
    decision["reasons"]
        .as_array()
        .is_some_and(|reasons| reasons.iter().any(|r| r["code"] == code))
}

fn summary(decision: &Value) -> String {
    let reasons: Vec<&str> = decision["reasons"]
        .as_array()
        .map(|rs| rs.iter().filter_map(|r| r["code"].as_str()).collect())
        .unwrap_or_default();
    format!(
        "{} backend={} reasons=[{}]",
        outcome(decision),
        decision["backend"].as_str().unwrap_or("-"),
        reasons.join(",")
    )
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
    fn outcomes_and_normalisation() {
        assert_eq!(outcome(&json!({"allow": true})), "allow");
        assert_eq!(
            outcome(&json!({"allow": true, "require_approval": true})),
            "review"
        );
        assert_eq!(outcome(&json!({"allow": false})), "deny");
        assert_eq!(outcome(&json!({})), "deny");
        assert_eq!(normalized(&json!({"mounts": []}), "mounts"), Value::Null);
        assert_eq!(
            normalized(
                &json!({"network": {"allow": [], "max_connections": 1}}),
                "network"
            ),
            Value::Null
        );
    }
}
