//! Refusals that anyone can cause in bulk (failed authentications, upload-path traversal,
//! another tenant's ids, a full queue), recorded without letting them flood the audit trail.
//!
//! Per window (`refusals.window_s`, default 60 s) and per *bucket* (kind, source address,
//! claimed or calling key id, tenant):
//! - the first refusal is written at once, as its own audit event (fail closed: if it cannot be
//!   written, the request gets 503, as before);
//! - later ones in the same window are only counted; when the window ends, one
//!   `<kind>.repeated` event carries the count (and how many were throttled);
//! - past `per_source` refusals from one address, or `per_key` for one claimed key id, in the
//!   window, the request is refused with 429 and `retry-after` (the window's remaining time).
//!
//! Memory is bounded too: at most [`MAX_BUCKETS`] buckets per window; past it, refusals share
//! one overflow bucket (no source, no key), still counted and still throttled.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use api_types::EventKind;

use super::App;
use crate::audit::{events, NewEvent};

/// Most buckets one window tracks.
pub const MAX_BUCKETS: usize = 4096;
/// Longest free text (a path) kept in a refusal's audit row; longer ones keep their first
/// [`MAX_TEXT`] bytes, their length and their SHA-256.
pub const MAX_TEXT: usize = 128;

pub use crate::config::RefusalLimits;

/// What was refused. Each is a closed audit event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// 401: no key, or one that matches nothing.
    AuthFailure,
    /// 400: an upload name that would leave `/workspace`.
    UploadTraversal,
    /// 404 to an agent for an id that exists in another tenant.
    CrossTenantProbe,
    /// 429: the execution queue is full.
    QueueFull,
}

impl RefusalKind {
    /// The audit event kind of the first refusal of a window.
    pub fn event_kind(self) -> EventKind {
        match self {
            RefusalKind::AuthFailure => EventKind::AuthFailure,
            RefusalKind::UploadTraversal => EventKind::RequestTraversal,
            RefusalKind::CrossTenantProbe => EventKind::RequestCrossTenant,
            RefusalKind::QueueFull => EventKind::QueueRefused,
        }
    }

    /// The event's `key_id` column and `input.claimed_key_id` for `key_id`: a failed
    /// authentication's key id is only claimed (never the acting key), so it stays in the input.
    fn key_columns(self, key_id: Option<&str>) -> (Option<String>, Option<String>) {
        let key_id = key_id.map(str::to_owned);
        match self {
            RefusalKind::AuthFailure => (None, key_id),
            _ => (key_id, None),
        }
    }

    /// The audit event kind of a window's summary.
    pub fn repeated_kind(self) -> EventKind {
        match self {
            RefusalKind::AuthFailure => EventKind::AuthFailureRepeated,
            RefusalKind::UploadTraversal => EventKind::RequestTraversalRepeated,
            RefusalKind::CrossTenantProbe => EventKind::RequestCrossTenantRepeated,
            RefusalKind::QueueFull => EventKind::QueueRefusedRepeated,
        }
    }
}

/// One refusal: who caused it and what it was about (already bounded, see [`bounded_text`]).
#[derive(Debug, Clone)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub source: Option<IpAddr>,
    /// The key id claimed (failed authentication) or the caller's.
    pub key_id: Option<String>,
    pub tenant: Option<String>,
    /// Reason code, e.g. `auth.unknown_key`.
    pub code: String,
    /// What the row keeps about the request: bounded by the caller.
    pub detail: Value,
}

/// What to do with a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The first of its bucket in this window: write it now, then answer.
    Record,
    /// Counted for the window's summary; answer as usual.
    Counted,
    /// Over the rate: answer 429 with `retry-after`.
    Throttled { retry_after: Duration },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BucketKey {
    kind: RefusalKind,
    /// Each reason (`auth.missing_key`, `auth.unknown_key`, ...) has its own first event.
    code: String,
    source: Option<IpAddr>,
    key_id: Option<String>,
    tenant: Option<String>,
}

#[derive(Debug, Default)]
struct Bucket {
    /// Refusals after the first (which was written on its own).
    repeats: u64,
    throttled: u64,
    code: String,
    detail: Value,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    started_at: DateTime<Utc>,
    buckets: HashMap<BucketKey, Bucket>,
    by_source: HashMap<Option<IpAddr>, u32>,
    by_key: HashMap<String, u32>,
}

impl Window {
    fn new() -> Window {
        Window {
            started: Instant::now(),
            started_at: crate::ids::now_micros(),
            buckets: HashMap::new(),
            by_source: HashMap::new(),
            by_key: HashMap::new(),
        }
    }
}

/// The refusals of the current window.
#[derive(Debug)]
pub struct Refusals {
    limits: RefusalLimits,
    window: Mutex<Window>,
}

impl Refusals {
    pub fn new(limits: RefusalLimits) -> Refusals {
        Refusals {
            limits,
            window: Mutex::new(Window::new()),
        }
    }

    pub fn window(&self) -> Duration {
        Duration::from_secs(self.limits.window_s.max(1))
    }

    /// Counts `refusal` and says what to do with it.
    pub fn note(&self, refusal: &Refusal) -> Verdict {
        let mut window = self.lock();
        // A window starts with its first refusal.
        if window.buckets.is_empty() {
            window.started = Instant::now();
            window.started_at = crate::ids::now_micros();
        }
        let retry_after = self.window().saturating_sub(window.started.elapsed());
        let from_source = match refusal.source {
            Some(ip) => bump(&mut window.by_source, Some(ip), MAX_BUCKETS),
            None => 0,
        };
        let for_key = match &refusal.key_id {
            Some(id) => bump(&mut window.by_key, id.clone(), MAX_BUCKETS),
            None => 0,
        };
        let mut key = BucketKey {
            kind: refusal.kind,
            code: refusal.code.clone(),
            source: refusal.source,
            key_id: refusal.key_id.clone(),
            tenant: refusal.tenant.clone(),
        };
        if window.buckets.len() >= MAX_BUCKETS && !window.buckets.contains_key(&key) {
            key = BucketKey {
                kind: refusal.kind,
                code: String::new(),
                source: None,
                key_id: None,
                tenant: None,
            };
        }
        let fresh = !window.buckets.contains_key(&key);
        let bucket = window.buckets.entry(key).or_default();
        bucket.code.clone_from(&refusal.code);
        bucket.detail = refusal.detail.clone();
        if from_source > self.limits.per_source || for_key > self.limits.per_key {
            bucket.throttled += 1;
            return Verdict::Throttled {
                retry_after: retry_after.max(Duration::from_secs(1)),
            };
        }
        if fresh {
            return Verdict::Record;
        }
        bucket.repeats += 1;
        Verdict::Counted
    }

    /// Ends the window if it has run its length (or at once with `now`, at shutdown): the
    /// summary events of what it counted beyond each bucket's first refusal.
    pub fn roll(&self, now: bool) -> Vec<NewEvent> {
        let mut window = self.lock();
        if window.buckets.is_empty() || (!now && window.started.elapsed() < self.window()) {
            return Vec::new();
        }
        let ended = std::mem::replace(&mut *window, Window::new());
        drop(window);
        summaries(ended, crate::ids::now_micros())
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Adds one to `key`'s count (a new key only while the map has room: past it, the refusal is
/// counted under no source) and returns the count.
fn bump<K: std::hash::Hash + Eq + Default>(
    counts: &mut HashMap<K, u32>,
    key: K,
    max: usize,
) -> u32 {
    let key = if counts.len() >= max && !counts.contains_key(&key) {
        K::default()
    } else {
        key
    };
    let count = counts.entry(key).or_insert(0);
    *count = count.saturating_add(1);
    *count
}

fn summaries(ended: Window, until: DateTime<Utc>) -> Vec<NewEvent> {
    ended
        .buckets
        .into_iter()
        .filter(|(_, bucket)| bucket.repeats + bucket.throttled > 0)
        .map(|(key, bucket)| {
            let (key_id, claimed_key_id) = key.kind.key_columns(key.key_id.as_deref());
            NewEvent {
                kind: key.kind.repeated_kind(),
                execution_id: None,
                key_id,
                tenant: key.tenant.clone(),
                decision_id: None,
                allow: Some(false),
                reasons: events::reason(&bucket.code, "repeated refusals, aggregated"),
                input: events::column(&events::refusals::RefusedRepeatedly {
                    source: key.source.map(|ip| ip.to_string()),
                    claimed_key_id,
                    window_start: ended.started_at,
                    window_end: until,
                    last: bucket.detail,
                }),
                decision: events::column(&events::refusals::Repeats {
                    allow: false,
                    repeats: bucket.repeats,
                    throttled: bucket.throttled,
                }),
                policy_revision: None,
            }
        })
        .collect()
}

/// `text` as an audit row may hold it: whole when short, else its first [`MAX_TEXT`] bytes
/// (on a character boundary), its length and its SHA-256.
pub fn bounded_text(text: &str) -> Value {
    if text.len() <= MAX_TEXT {
        return json!(text);
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    json!({
        "prefix": &text[..end],
        "bytes": text.len(),
        "sha256": hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes())),
    })
}

/// Largest JSON input an audit row keeps whole (`POST /v1/policy/evaluate`); a larger one is
/// kept as its size and SHA-256.
pub const MAX_STORED_INPUT: usize = 16 * 1024;

/// `value` as an audit row may hold it: whole when its JSON is at most [`MAX_STORED_INPUT`]
/// bytes and has no NUL (which PostgreSQL's jsonb refuses), else its size and SHA-256 (of the
/// compact JSON text), so the row stays small and can still be matched against a copy.
pub fn bounded_json(value: &Value) -> Value {
    let text = value.to_string();
    if text.len() <= MAX_STORED_INPUT && !text.contains("\\u0000") {
        return value.clone();
    }
    json!({
        "stored": false,
        "bytes": text.len(),
        "sha256": hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes())),
    })
}

impl App {
    /// Notes a refusal and, when it is the first of its window, writes it. `Err` only when
    /// that write fails (the caller answers 503).
    pub async fn refuse(&self, refusal: Refusal) -> Result<Verdict, crate::audit::AuditError> {
        let verdict = self.refusals.note(&refusal);
        if verdict == Verdict::Record {
            let (key_id, claimed_key_id) = refusal.kind.key_columns(refusal.key_id.as_deref());
            let event = NewEvent {
                kind: refusal.kind.event_kind(),
                execution_id: None,
                key_id,
                tenant: refusal.tenant.clone(),
                decision_id: None,
                allow: Some(false),
                reasons: events::reason(&refusal.code, "refused"),
                input: events::column(&events::refusals::Refused {
                    source: refusal.source.map(|ip| ip.to_string()),
                    claimed_key_id,
                    request: refusal.detail.clone(),
                }),
                decision: events::column(&events::egress::Verdict { allow: false }),
                policy_revision: None,
            };
            self.audit.record_event(&event).await?;
        }
        Ok(verdict)
    }
}

impl App {
    /// An agent asked for an id of another tenant's execution: audited (bounded) and answered
    /// exactly as a missing id, even past the rate (a 429 there would tell that the id exists).
    pub(super) async fn cross_tenant_probe(
        &self,
        caller: &crate::audit::ApiKey,
        id: &str,
        owner: &str,
    ) -> super::AppError {
        let refusal = Refusal {
            kind: RefusalKind::CrossTenantProbe,
            source: None,
            key_id: Some(caller.id.clone()),
            tenant: Some(caller.tenant.clone()),
            code: "request.cross_tenant".to_owned(),
            detail: json!({"execution_id": bounded_text(id), "owner_tenant": bounded_text(owner)}),
        };
        match self.refuse(refusal).await {
            Ok(_) => super::AppError::NotFound,
            Err(err) => super::AppError::Unavailable(err),
        }
    }
}

/// Writes each window's summaries when it ends, until shutdown (then the last one).
pub async fn summarise_periodically(app: Arc<App>) {
    let tick = (app.refusals.window() / 4).max(Duration::from_millis(250));
    loop {
        let stopping = tokio::select! {
            () = app.shutdown.cancelled() => true,
            () = tokio::time::sleep(tick) => false,
        };
        for event in app.refusals.roll(stopping) {
            if let Err(err) = app.audit.record_event(&event).await {
                tracing::error!(kind = %event.kind, error = %super::error_chain(&err), "a refusal summary was not recorded");
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(source: [u8; 4], key: Option<&str>) -> Refusal {
        Refusal {
            kind: RefusalKind::AuthFailure,
            source: Some(IpAddr::from(source)),
            key_id: key.map(str::to_owned),
            tenant: None,
            code: "auth.unknown_key".to_owned(),
            detail: json!({"path": "/v1/executions"}),
        }
    }

    #[test]
    fn one_record_per_bucket_then_counts_then_429() {
        let refusals = Refusals::new(RefusalLimits {
            window_s: 3600,
            per_source: 5,
            per_key: 100,
        });
        let verdicts: Vec<Verdict> = (0..7)
            .map(|_| refusals.note(&failure([10, 0, 0, 1], None)))
            .collect();
        assert_eq!(verdicts[0], Verdict::Record);
        assert!(verdicts[1..5].iter().all(|v| *v == Verdict::Counted));
        assert!(
            matches!(verdicts[5], Verdict::Throttled { retry_after } if retry_after > Duration::from_secs(3000))
        );
        // Another source has its own bucket and budget.
        assert_eq!(
            refusals.note(&failure([10, 0, 0, 2], None)),
            Verdict::Record
        );
    }

    #[test]
    fn a_claimed_key_is_limited_across_sources() {
        let refusals = Refusals::new(RefusalLimits {
            window_s: 3600,
            per_source: 1000,
            per_key: 3,
        });
        for last in 0..3u8 {
            let verdict = refusals.note(&failure([10, 0, 1, last], Some("key_a")));
            assert!(!matches!(verdict, Verdict::Throttled { .. }));
        }
        let verdict = refusals.note(&failure([10, 0, 1, 9], Some("key_a")));
        assert!(matches!(verdict, Verdict::Throttled { .. }), "{verdict:?}");
    }

    #[test]
    fn a_window_ends_in_one_summary_per_bucket_with_the_count() {
        let refusals = Refusals::new(RefusalLimits {
            window_s: 0,
            per_source: 3,
            per_key: 100,
        });
        for _ in 0..10 {
            refusals.note(&failure([10, 0, 0, 1], None));
        }
        std::thread::sleep(Duration::from_millis(1100));
        let events = refusals.roll(false);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::AuthFailureRepeated);
        assert_eq!(events[0].decision["repeats"], 2);
        assert_eq!(events[0].decision["throttled"], 7);
        assert!(refusals.roll(false).is_empty());
        refusals.note(&failure([10, 0, 0, 1], None));
        refusals.note(&failure([10, 0, 0, 1], None));
        assert_eq!(
            refusals.roll(true).len(),
            1,
            "shutdown writes what it counted"
        );
    }

    #[test]
    fn memory_stays_bounded_under_many_sources() {
        let refusals = Refusals::new(RefusalLimits::default());
        for i in 0..(MAX_BUCKETS as u32 + 500) {
            refusals.note(&failure(i.to_be_bytes(), None));
        }
        let window = refusals.lock();
        assert!(window.buckets.len() <= MAX_BUCKETS + 1);
        assert!(window.by_source.len() <= MAX_BUCKETS + 1);
    }

    #[test]
    fn large_or_nul_inputs_are_kept_as_a_hash() {
        let small = json!({"a": 1});
        assert_eq!(bounded_json(&small), small);
        let large = json!({"code": "x".repeat(MAX_STORED_INPUT)});
        let kept = bounded_json(&large);
        assert_eq!(kept["stored"], false);
        assert!(kept.to_string().len() < 200);
        assert_eq!(bounded_json(&json!({"a": "b\u{0}"}))["stored"], false);
    }

    #[test]
    fn long_text_is_cut_and_hashed() {
        let long = "/v1/".to_owned() + &"é".repeat(40_000);
        let kept = bounded_text(&long);
        assert!(kept.to_string().len() < 400, "{kept}");
        assert_eq!(kept["bytes"], long.len());
        assert_eq!(bounded_text("/v1/x"), json!("/v1/x"));
    }
}
