//! Prometheus metrics, served at `GET /metrics` in the text exposition format 0.0.4.
//!
//! Every label is a closed set (an enum here, or the configured languages), so no series is
//! ever keyed by an execution, a tenant or a host. The counters are bumped by the audit store
//! when a record commits, so they count what the audit store holds, not what was attempted.
//! The gauges are set by their owners through [`Metrics::set_warm_pool_ready`] and
//! [`Metrics::set_sessions_open`] (the warm pool and sessions; 0 until those exist).
//!
//! It is not a metrics library: one small encoder for the few series the gateway has.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use api_types::TextSet;

use crate::status::ExecutionStatus;

/// Languages the warm-pool gauge accepts at most (they come from config, so this is a guard).
pub const MAX_LANGUAGES: usize = 64;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How a claim on the warm pool went (`sandgate_warm_claims_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WarmClaim {
    /// A waiting sandbox of exactly the decision's key was taken.
    Hit,
    /// Nothing of this key was claimed in the window (nor is it a floor): none could wait.
    MissNewKey,
    /// A known key, but none waited.
    MissEmpty,
}

impl WarmClaim {
    pub const ALL: [WarmClaim; 3] = [WarmClaim::Hit, WarmClaim::MissNewKey, WarmClaim::MissEmpty];

    pub fn as_str(self) -> &'static str {
        match self {
            WarmClaim::Hit => "hit",
            WarmClaim::MissNewKey => "miss_new_key",
            WarmClaim::MissEmpty => "miss_empty",
        }
    }
}

/// The warm pool as it is at a scrape (the pool is the source of truth).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WarmSnapshot {
    /// Claims since start per (language, result).
    pub claims: BTreeMap<(String, WarmClaim), u64>,
    /// Waiting sandboxes per language (every pooled language, 0 included).
    pub waiting: BTreeMap<String, usize>,
    /// Container memory all waiting sandboxes hold, bytes.
    pub waiting_memory_bytes: u64,
}

/// What the execution policy decided, as the gateway then acted on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionOutcome {
    Allow,
    Deny,
    RequireApproval,
}

impl DecisionOutcome {
    const ALL: [DecisionOutcome; 3] = [
        DecisionOutcome::Allow,
        DecisionOutcome::Deny,
        DecisionOutcome::RequireApproval,
    ];

    fn as_str(self) -> &'static str {
        match self {
            DecisionOutcome::Allow => "allow",
            DecisionOutcome::Deny => "deny",
            DecisionOutcome::RequireApproval => "require_approval",
        }
    }
}

/// An egress connection attempt, allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressDecision {
    Allow,
    Deny,
}

impl EgressDecision {
    const ALL: [EgressDecision; 2] = [EgressDecision::Allow, EgressDecision::Deny];

    fn as_str(self) -> &'static str {
        match self {
            EgressDecision::Allow => "allow",
            EgressDecision::Deny => "deny",
        }
    }
}

/// A cumulative histogram with fixed upper bounds, in seconds.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// One per bound, plus `+Inf`; not cumulative (summed when rendered).
    buckets: Vec<AtomicU64>,
    /// The sum in microseconds (integer, so it can be added atomically).
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        let slot = self
            .bounds
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(self.bounds.len());
        if let Some(bucket) = self.buckets.get(slot) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0u64;
        for (index, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = match self.bounds.get(index) {
                Some(bound) => format!("{bound}"),
                None => "+Inf".to_owned(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// Execution wall time: a sandbox start is ~0.3 s, the ceiling is minutes.
const EXECUTION_BOUNDS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
/// One audit transaction: sub-millisecond to a slow disk.
const AUDIT_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Stored values outside their closed set, per set (`audit::unknown_value`). Process-wide, not
/// in [`Metrics`]: the count is taken where a row fails to decode, which has no store at hand.
static STORE_UNKNOWN_VALUES: [AtomicU64; TextSet::ALL.len()] =
    [const { AtomicU64::new(0) }; TextSet::ALL.len()];

/// A row held a value of `set` that is none of it (see `audit::unknown_value`).
pub fn store_unknown_value(set: TextSet) {
    if let Some(slot) = TextSet::ALL.iter().position(|s| *s == set) {
        STORE_UNKNOWN_VALUES[slot].fetch_add(1, Ordering::Relaxed);
    }
}

/// The gateway's metrics: one per process, shared by the audit store and the HTTP edge.
#[derive(Debug)]
pub struct Metrics {
    executions: [AtomicU64; ExecutionStatus::ALL.len()],
    decisions: [AtomicU64; DecisionOutcome::ALL.len()],
    egress: [AtomicU64; EgressDecision::ALL.len()],
    execution_seconds: Histogram,
    audit_append_seconds: Histogram,
    warm_pool_ready: Mutex<BTreeMap<String, i64>>,
    warm: Mutex<WarmSnapshot>,
    sessions_open: AtomicI64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(std::iter::empty::<&str>())
    }
}

impl Metrics {
    /// Metrics whose warm-pool gauge has a series (at 0) for each of `languages`.
    pub fn new<'a>(languages: impl IntoIterator<Item = &'a str>) -> Metrics {
        let ready: BTreeMap<String, i64> = languages
            .into_iter()
            .take(MAX_LANGUAGES)
            .map(|language| (language.to_owned(), 0))
            .collect();
        let warm_languages: Vec<String> = ready.keys().cloned().collect();
        Metrics {
            executions: Default::default(),
            decisions: Default::default(),
            egress: Default::default(),
            execution_seconds: Histogram::new(EXECUTION_BOUNDS),
            audit_append_seconds: Histogram::new(AUDIT_BOUNDS),
            warm_pool_ready: Mutex::new(ready),
            warm: Mutex::new(WarmSnapshot {
                waiting: warm_languages.into_iter().map(|l| (l, 0)).collect(),
                ..WarmSnapshot::default()
            }),
            sessions_open: AtomicI64::new(0),
        }
    }

    /// An execution record reached a final status (counted once per record).
    pub fn execution_finished(&self, status: ExecutionStatus) {
        if let Some(slot) = ExecutionStatus::ALL.iter().position(|s| *s == status) {
            self.executions[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A sandbox ran for `ran`.
    pub fn execution_ran(&self, ran: Duration) {
        self.execution_seconds.observe(ran);
    }

    pub fn decision(&self, outcome: DecisionOutcome) {
        if let Some(slot) = DecisionOutcome::ALL.iter().position(|o| *o == outcome) {
            self.decisions[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn egress(&self, decision: EgressDecision) {
        if let Some(slot) = EgressDecision::ALL.iter().position(|d| *d == decision) {
            self.egress[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One committed audit transaction took `took`.
    pub fn audit_appended(&self, took: Duration) {
        self.audit_append_seconds.observe(took);
    }

    /// The warm pool's ready sandboxes for `language`. A language beyond [`MAX_LANGUAGES`]
    /// distinct ones is ignored (and logged), so the series stay bounded.
    pub fn set_warm_pool_ready(&self, language: &str, ready: i64) {
        let Ok(mut gauges) = self.warm_pool_ready.lock() else {
            return;
        };
        if gauges.len() >= MAX_LANGUAGES && !gauges.contains_key(language) {
            tracing::warn!(
                language,
                "warm pool gauge: too many languages, not recorded"
            );
            return;
        }
        gauges.insert(language.to_owned(), ready);
    }

    /// The warm pool's claims, waiting sandboxes and their memory (set at each scrape). A
    /// language beyond [`MAX_LANGUAGES`] is left out, so the series stay bounded.
    pub fn set_warm(&self, mut snapshot: WarmSnapshot) {
        let languages: std::collections::BTreeSet<String> = snapshot
            .waiting
            .keys()
            .chain(snapshot.claims.keys().map(|(language, _)| language))
            .take(MAX_LANGUAGES)
            .cloned()
            .collect();
        snapshot
            .waiting
            .retain(|language, _| languages.contains(language));
        snapshot
            .claims
            .retain(|(language, _), _| languages.contains(language));
        if let Ok(mut warm) = self.warm.lock() {
            *warm = snapshot;
        }
    }

    /// Sessions open in this gateway.
    pub fn set_sessions_open(&self, open: i64) {
        self.sessions_open.store(open, Ordering::Relaxed);
    }

    /// Everything, in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        counter_family(
            &mut out,
            "sandgate_executions_total",
            "Execution records by final status (denied included).",
            ExecutionStatus::ALL
                .iter()
                .zip(&self.executions)
                .filter(|(status, _)| status.is_final())
                .map(|(status, count)| ("status", status.as_str(), count)),
        );
        counter_family(
            &mut out,
            "sandgate_decisions_total",
            "Execution policy decisions by outcome, as recorded in the audit store.",
            DecisionOutcome::ALL
                .iter()
                .zip(&self.decisions)
                .map(|(outcome, count)| ("outcome", outcome.as_str(), count)),
        );
        counter_family(
            &mut out,
            "sandgate_egress_total",
            "Egress connection attempts by decision.",
            EgressDecision::ALL
                .iter()
                .zip(&self.egress)
                .map(|(decision, count)| ("decision", decision.as_str(), count)),
        );
        counter_family(
            &mut out,
            "sandgate_store_unknown_values_total",
            "Rows not read because a column held a value outside its closed set.",
            TextSet::ALL
                .iter()
                .zip(&STORE_UNKNOWN_VALUES)
                .map(|(set, count)| ("column", stored_column(*set), count)),
        );
        self.render_histograms(&mut out);
        self.render_gauges(&mut out);
        out
    }

    fn render_histograms(&self, out: &mut String) {
        for (name, help, histogram) in [
            (
                "sandgate_execution_seconds",
                "Wall time of executions that ran, from sandbox start to exit.",
                &self.execution_seconds,
            ),
            (
                "sandgate_audit_append_seconds",
                "Time to commit one audit transaction (an event and its record).",
                &self.audit_append_seconds,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            histogram.render(out, name);
        }
    }

    fn render_gauges(&self, out: &mut String) {
        let name = "sandgate_warm_pool_ready";
        let _ = writeln!(
            out,
            "# HELP {name} Pre-started sandboxes waiting, per language.\n# TYPE {name} gauge"
        );
        if let Ok(gauges) = self.warm_pool_ready.lock() {
            for (language, ready) in gauges.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{language=\"{}\"}} {ready}",
                    escape_label(language)
                );
            }
        }
        self.render_warm(out);
        let name = "sandgate_sessions_open";
        let open = self.sessions_open.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP {name} Sessions open in this gateway.\n# TYPE {name} gauge\n{name} {open}"
        );
    }
}

fn counter_family<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (&'static str, &'static str, &'a AtomicU64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (label, value, count) in series {
        let count = count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
    }
}

impl Metrics {
    fn render_warm(&self, out: &mut String) {
        let Ok(warm) = self.warm.lock() else {
            return;
        };
        let name = "sandgate_warm_claims_total";
        let _ = writeln!(
            out,
            "# HELP {name} Claims on the warm pool by language and result.\n# TYPE {name} counter"
        );
        let languages: std::collections::BTreeSet<&String> = warm
            .waiting
            .keys()
            .chain(warm.claims.keys().map(|(language, _)| language))
            .collect();
        for language in &languages {
            for result in WarmClaim::ALL {
                let count = warm
                    .claims
                    .get(&((*language).clone(), result))
                    .copied()
                    .unwrap_or(0);
                let _ = writeln!(
                    out,
                    "{name}{{language=\"{}\",result=\"{}\"}} {count}",
                    escape_label(language),
                    result.as_str()
                );
            }
        }
        let name = "sandgate_warm_waiting";
        let _ = writeln!(
            out,
            "# HELP {name} Sandboxes waiting in the warm pool, per language (every key).\n# TYPE {name} gauge"
        );
        for (language, waiting) in &warm.waiting {
            let _ = writeln!(
                out,
                "{name}{{language=\"{}\"}} {waiting}",
                escape_label(language)
            );
        }
        let name = "sandgate_warm_waiting_memory_bytes";
        let _ = writeln!(
            out,
            "# HELP {name} Container memory all waiting sandboxes hold together.\n# TYPE {name} gauge\n{name} {}",
            warm.waiting_memory_bytes
        );
    }
}

/// A label value as the text format wants it (backslash, quote and newline escaped).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The column that holds a closed set's values (each set is stored in one column): the label
/// of `sandgate_store_unknown_values_total`.
pub fn stored_column(set: TextSet) -> &'static str {
    match set {
        TextSet::ExecutionStatus => "executions.status",
        TextSet::SessionStatus => "sessions.status",
        TextSet::ClosedReason => "sessions.closed_reason",
        TextSet::ApprovalStatus => "approvals.status",
        TextSet::Role => "api_keys.role",
        TextSet::ProposalStatus => "policy_proposals.status",
        TextSet::ProposalOrigin => "policy_proposals.origin",
        TextSet::ExecutionStart => "executions.start",
        TextSet::SessionStart => "sessions.start",
        TextSet::TurnKind => "session_turns.kind",
        TextSet::TurnErrorCode => "session_turns.error_code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_count_everything() {
        let metrics = Metrics::default();
        metrics.execution_ran(Duration::from_millis(50));
        metrics.execution_ran(Duration::from_millis(700));
        metrics.execution_ran(Duration::from_secs(1000));
        let text = metrics.render();
        assert!(text.contains("sandgate_execution_seconds_bucket{le=\"0.1\"} 1\n"));
        assert!(text.contains("sandgate_execution_seconds_bucket{le=\"1\"} 2\n"));
        assert!(text.contains("sandgate_execution_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("sandgate_execution_seconds_count 3\n"));
        assert!(text.contains("sandgate_execution_seconds_sum 1000.75\n"));
    }

    #[test]
    fn only_final_statuses_are_series_of_the_executions_counter() {
        let metrics = Metrics::default();
        metrics.execution_finished(ExecutionStatus::Denied);
        let text = metrics.render();
        assert!(text.contains("sandgate_executions_total{status=\"denied\"} 1\n"));
        assert!(text.contains("sandgate_executions_total{status=\"succeeded\"} 0\n"));
        assert!(!text.contains("status=\"running\""));
    }

    #[test]
    fn the_warm_pool_gauge_is_bounded_and_escaped() {
        let metrics = Metrics::new(["python"]);
        assert!(metrics
            .render()
            .contains("sandgate_warm_pool_ready{language=\"python\"} 0\n"));
        metrics.set_warm_pool_ready("we\"ird", 2);
        assert!(metrics
            .render()
            .contains("sandgate_warm_pool_ready{language=\"we\\\"ird\"} 2\n"));
        for n in 0..(MAX_LANGUAGES * 2) {
            metrics.set_warm_pool_ready(&format!("l{n}"), 1);
        }
        let series = metrics
            .render()
            .matches("sandgate_warm_pool_ready{")
            .count();
        assert_eq!(series, MAX_LANGUAGES);
    }

    #[test]
    fn the_warm_claims_waiting_and_memory_series() {
        let metrics = Metrics::new(["python"]);
        metrics.set_warm(WarmSnapshot {
            claims: BTreeMap::from([
                (("python".to_owned(), WarmClaim::Hit), 7),
                (("bash".to_owned(), WarmClaim::MissNewKey), 1),
            ]),
            waiting: BTreeMap::from([("python".to_owned(), 3), ("bash".to_owned(), 0)]),
            waiting_memory_bytes: 3 * 704 * 1024 * 1024,
        });
        let text = metrics.render();
        for line in [
            "sandgate_warm_claims_total{language=\"python\",result=\"hit\"} 7\n",
            "sandgate_warm_claims_total{language=\"python\",result=\"miss_empty\"} 0\n",
            "sandgate_warm_claims_total{language=\"bash\",result=\"miss_new_key\"} 1\n",
            "sandgate_warm_waiting{language=\"python\"} 3\n",
            "sandgate_warm_waiting{language=\"bash\"} 0\n",
            "sandgate_warm_waiting_memory_bytes 2214592512\n",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        let many = WarmSnapshot {
            waiting: (0..MAX_LANGUAGES * 2)
                .map(|n| (format!("l{n}"), 1))
                .collect(),
            ..WarmSnapshot::default()
        };
        metrics.set_warm(many);
        assert_eq!(
            metrics.render().matches("sandgate_warm_waiting{").count(),
            MAX_LANGUAGES
        );
    }
}
