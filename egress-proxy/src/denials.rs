//! Denied attempts of one execution, bounded. Each denial is normally recorded on its own (a
//! row and an audit event), but a sandbox can make thousands a second; so past
//! [`ExecutionLimits::max_denied`] in all, or [`ExecutionLimits::max_denied_per_s`] in one
//! second, a denial is refused with `egress.too_many_denials` without a row of its own and
//! counted instead; the counts go to the recorder as one [`Suppressed`] summary per
//! [`SUMMARY_WINDOW`] (and a last one when the listener closes). So every attempt is either a
//! row or part of a count.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::config::ExecutionLimits;
use crate::reason::ReasonCode;
use crate::seams::Suppressed;

/// How long suppressed denials are counted before their summary is handed to the recorder.
pub const SUMMARY_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct State {
    recorded: u32,
    second_started: Instant,
    in_second: u32,
    window_started: SystemTime,
    window_instant: Instant,
    suppressed: BTreeMap<&'static str, u64>,
}

/// The denial budget of one execution.
#[derive(Debug)]
pub(crate) struct Denials {
    max_total: u32,
    max_per_second: u32,
    state: Mutex<State>,
}

impl Denials {
    pub(crate) fn new(limits: &ExecutionLimits) -> Denials {
        Denials {
            max_total: limits.max_denied,
            max_per_second: limits.max_denied_per_s,
            state: Mutex::new(State {
                recorded: 0,
                second_started: Instant::now(),
                in_second: 0,
                window_started: SystemTime::now(),
                window_instant: Instant::now(),
                suppressed: BTreeMap::new(),
            }),
        }
    }

    /// Whether a denial for `reason` may be recorded on its own (`true`), or is counted.
    pub(crate) fn admit(&self, reason: ReasonCode) -> bool {
        let mut state = self.lock();
        if state.second_started.elapsed() >= Duration::from_secs(1) {
            state.second_started = Instant::now();
            state.in_second = 0;
        }
        if state.recorded < self.max_total && state.in_second < self.max_per_second {
            state.recorded += 1;
            state.in_second += 1;
            return true;
        }
        if state.suppressed.is_empty() {
            state.window_started = SystemTime::now();
            state.window_instant = Instant::now();
        }
        *state.suppressed.entry(reason.code()).or_insert(0) += 1;
        false
    }

    /// The counts of the window, once it has run [`SUMMARY_WINDOW`] (or at once with `now`).
    pub(crate) fn take(&self, execution_id: &str, tenant: &str, now: bool) -> Option<Suppressed> {
        let mut state = self.lock();
        let due = now || state.window_instant.elapsed() >= SUMMARY_WINDOW;
        if state.suppressed.is_empty() || !due {
            return None;
        }
        let by_reason: Vec<(String, u64)> = std::mem::take(&mut state.suppressed)
            .into_iter()
            .map(|(code, count)| (code.to_owned(), count))
            .collect();
        Some(Suppressed {
            execution_id: execution_id.to_owned(),
            tenant: tenant.to_owned(),
            count: by_reason.iter().map(|(_, count)| count).sum(),
            by_reason,
            from: state.window_started,
            until: SystemTime::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: u32, per_second: u32) -> ExecutionLimits {
        ExecutionLimits {
            max_denied: total,
            max_denied_per_s: per_second,
            ..ExecutionLimits::from_grant(&policy_engine::NetworkGrant {
                allow: Vec::new(),
                max_connections: 1,
                max_bytes: 1,
                max_denied: None,
                max_denied_per_s: None,
            })
        }
    }

    #[test]
    fn past_the_total_denials_are_counted_and_summarised() {
        let denials = Denials::new(&limits(3, 100));
        let admitted: Vec<bool> = (0..10)
            .map(|_| denials.admit(ReasonCode::HostNotGranted))
            .collect();
        assert_eq!(admitted.iter().filter(|a| **a).count(), 3);
        assert!(
            denials.take("ex_1", "acme", false).is_none(),
            "window not over"
        );
        let summary = denials.take("ex_1", "acme", true).unwrap();
        assert_eq!(summary.count, 7);
        assert_eq!(
            summary.by_reason,
            [("egress.host_not_granted".to_owned(), 7)]
        );
        assert!(denials.take("ex_1", "acme", true).is_none(), "taken once");
    }

    #[test]
    fn the_rate_resets_each_second() {
        let denials = Denials::new(&limits(1000, 2));
        let first: Vec<bool> = (0..4)
            .map(|_| denials.admit(ReasonCode::PolicyDenied))
            .collect();
        assert_eq!(first, [true, true, false, false]);
        std::thread::sleep(Duration::from_millis(1050));
        assert!(denials.admit(ReasonCode::PolicyDenied));
    }
}
