//! The warm pool: sandboxes started ahead, waiting with a resident runner (`sandbox-init pool`;
//! Python's imports `python_preload` first) or, for sessions, a session runner waiting for its
//! opening line. An execution or session whose decision the pool has a sandbox for claims it
//! instead of starting its own; every other starts cold.
//!
//! Split by responsibility: the key ([`super::pool_key`]: a waiting sandbox is keyed by the
//! whole container its decision implies), the sizing ([`super::pool_sizing`]), the refill task
//! and each waiting sandbox's keeper ([`super::pool_refill`]), refill by restoring a preloaded
//! template's checkpoint ([`super::pool_restore`]); here: the pool's state, the claim, and what
//! it reports.
//!
//! How many of each key wait is demand-driven: keys claimed in the last `warm_pool_window_s`
//! keep sandboxes in proportion to their claims within `warm_pool_memory_mb` for all waiting
//! sandboxes together; `warm_pool` is the floor for the configured default shape; a key no
//! longer claimed drains.
//!
//! Memory: a cold container's limit is the decision's `memory_mb`. A pooled Python sandbox with
//! a preload gets [`PRELOAD_MEMORY_MB`] on top, for what the waiting interpreter imported: the
//! program keeps what the decision granted, and the budget counts the whole container.
//!
//! One sandbox serves one execution (or one session) and is then removed: nothing of one run
//! reaches another. Waiting sandboxes take no execution slot; the refill boots one sandbox at
//! a time (or restores up to two of different keys) and only while nothing waits for a slot and fewer than half the slots run
//! (`Scheduler::is_quiet`), so it never delays a queued execution and leaves CPU to the running
//! ones.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::{oneshot, Notify};

use super::home::SandboxHome;
use super::pool_sizing::{self, Demand};
use crate::metrics::{WarmClaim, WarmSnapshot};
use crate::runtime::{
    Job, PoolRunner, Ran, RunControl, RuntimeError, Sandbox, SessionRunner, TurnRan, Waits,
};

pub use super::pool_key::{nano_rounded, MountKey, PoolKey, Serves, Shape};
pub use super::pool_refill::refill;
pub use super::pool_restore::Refill;
use super::pool_restore::Restore;

/// Memory a pooled Python container gets on top of the decision's, for what the waiting
/// interpreter imported (numpy, pandas and matplotlib hold about 150 MB under gVisor): the
/// program has what the decision granted, as it would cold. Without a preload, none.
pub const PRELOAD_MEMORY_MB: u64 = 192;
/// Most sandboxes of one key that wait, whatever the demand.
pub const MAX_PER_KEY: usize = 16;
/// Most claims remembered (the window's history is also cut by time).
const MAX_HISTORY: usize = 65_536;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How the pool is sized (from the configuration).
#[derive(Debug, Clone)]
pub struct Sizing {
    /// Sandboxes of the configured default shape kept whatever the demand.
    pub floors: BTreeMap<PoolKey, usize>,
    pub window: Duration,
    pub budget_mb: u64,
    /// Languages the pool serves (those with an image); empty: no pool.
    pub languages: BTreeSet<String>,
}

/// A claimed sandbox: the execution's (or session's) from now on.
#[derive(Debug)]
pub struct Claimed {
    /// A pooled one answers for its id to the reaper until it is discarded.
    pub sandbox: Box<dyn Sandbox>,
    pub home: SandboxHome,
}

/// A sandbox id the pool answers for (to the reaper) while it lives.
#[derive(Debug)]
pub struct Member {
    pool: Arc<WarmPool>,
    id: String,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.pool.lock().members.remove(&self.id);
    }
}

/// A claimed pooled sandbox: the sandbox itself, and its [`Member`] until it is discarded.
#[derive(Debug)]
struct Pooled {
    inner: Box<dyn Sandbox>,
    member: Member,
}

impl Sandbox for Pooled {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn closed(&mut self) -> BoxFuture<'_, ()> {
        self.inner.closed()
    }
    fn run(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<Ran, RuntimeError>> {
        self.inner.run(job, control)
    }
    fn discard(self: Box<Self>) -> BoxFuture<'static, ()> {
        let Pooled { inner, member } = *self;
        async move {
            inner.discard().await;
            drop(member);
        }
        .boxed()
    }
    fn open_session(&mut self, job: Job<'static>) -> BoxFuture<'_, Result<(), RuntimeError>> {
        self.inner.open_session(job)
    }
    fn turn(
        &mut self,
        job: Job<'static>,
        control: RunControl,
    ) -> BoxFuture<'_, Result<TurnRan, RuntimeError>> {
        self.inner.turn(job, control)
    }
    fn open_context(
        &mut self,
        runner: crate::runtime::SessionRunner,
        job: Job<'static>,
    ) -> BoxFuture<'_, Result<Box<dyn crate::runtime::CodeContext>, RuntimeError>> {
        self.inner.open_context(runner, job)
    }
}

pub(super) type ClaimReply = oneshot::Sender<Claimed>;

#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) key: PoolKey,
    pub(super) claim: oneshot::Sender<ClaimReply>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) waiting: Vec<Waiting>,
    /// Ids of every sandbox the pool started that still exists (waiting or claimed).
    pub(super) members: BTreeSet<String>,
    /// Claims in the window, oldest first.
    history: VecDeque<(Instant, PoolKey)>,
    /// The targets last computed (for `/readyz`).
    pub(super) targets: BTreeMap<PoolKey, usize>,
    /// Claims so far per language and result (`sandgate_warm_claims_total`).
    claims: BTreeMap<(String, WarmClaim), u64>,
    /// Per key: why its last start failed (absent while its starts succeed).
    failing: BTreeMap<PoolKey, String>,
    /// Per failing key: not retried before this, and the next back-off.
    retry: BTreeMap<PoolKey, (Instant, Duration)>,
    /// Per key: starts in flight ([`Starting`]), counted as waiting when choosing the next.
    starting: BTreeMap<PoolKey, usize>,
}

/// A start of a sandbox of `key` in flight: counted by [`WarmPool::next_to_start`] as if it
/// waited (several restores may run at once) until dropped.
#[derive(Debug)]
pub(super) struct Starting {
    pool: Arc<WarmPool>,
    pub(super) key: PoolKey,
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        if let Some(count) = state.starting.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                state.starting.remove(&self.key);
            }
        }
    }
}

/// One line of `/readyz`'s `warm_pool.keys`.
#[derive(Debug, Clone)]
pub struct KeyCount {
    pub key: PoolKey,
    pub waiting: usize,
    pub target: usize,
    /// Whether it refills by restore or by boot.
    pub refill: Refill,
}

#[derive(Debug)]
pub struct WarmPool {
    sizing: Sizing,
    preload: Vec<String>,
    /// Refill by restore: the templates (empty when every sandbox is booted).
    pub(super) restore: Restore,
    state: Mutex<State>,
    pub(super) wake: Notify,
    /// Signalled when starting sandboxes works again after failing (dockerd came back): what
    /// could not be removed while it was away is swept now, not at the next periodic sweep.
    recovered: Notify,
}

impl WarmPool {
    /// `templates`: where refill by restore keeps its templates (`None`: every sandbox is
    /// booted; see [`super::pool_restore`]).
    pub fn new(
        sizing: Sizing,
        preload: Vec<String>,
        templates: Option<std::path::PathBuf>,
        keep_restoring_when_slower: bool,
    ) -> Arc<WarmPool> {
        let targets = sizing.floors.clone();
        Arc::new(WarmPool {
            sizing,
            preload,
            restore: Restore::new(templates, keep_restoring_when_slower),
            state: Mutex::new(State {
                targets,
                ..State::default()
            }),
            wake: Notify::new(),
            recovered: Notify::new(),
        })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn enabled(&self) -> bool {
        !self.sizing.languages.is_empty()
    }

    /// Languages the pool serves.
    pub fn languages(&self) -> impl Iterator<Item = &str> {
        self.sizing.languages.iter().map(String::as_str)
    }

    /// Container memory of one waiting sandbox of `key`, MB.
    pub fn cost_mb(&self, key: &PoolKey) -> u64 {
        let preloads =
            key.language == "python" && key.serves == Serves::Execution && !self.preload.is_empty();
        key.memory_mb + if preloads { PRELOAD_MEMORY_MB } else { 0 }
    }

    /// A waiting sandbox of exactly `key`, if one is ready; every claim counts as demand for
    /// its key. Never hands out a sandbox that died waiting.
    pub(super) async fn claim(self: &Arc<Self>, key: &PoolKey) -> Option<Claimed> {
        if !self.sizing.languages.contains(&key.language) {
            return None;
        }
        let mut first = true;
        loop {
            let waiting = self.take_waiting(key, std::mem::take(&mut first))?;
            self.wake.notify_one();
            let (reply, answer) = oneshot::channel();
            if waiting.claim.send(reply).is_err() {
                continue;
            }
            if let Ok(mut claimed) = answer.await {
                // Its end may have arrived between the watcher's last look and the claim.
                if claimed.sandbox.closed().now_or_never().is_some() {
                    tracing::warn!(sandbox = %claimed.home.id, "a claimed pooled sandbox had ended; removed");
                    claimed.sandbox.discard().await;
                    let id = claimed.home.id.clone();
                    claimed.home.remove();
                    self.lock().members.remove(&id);
                    continue;
                }
                let member = Member {
                    pool: Arc::clone(self),
                    id: claimed.home.id.clone(),
                };
                return Some(Claimed {
                    sandbox: Box::new(Pooled {
                        inner: claimed.sandbox,
                        member,
                    }),
                    home: claimed.home,
                });
            }
        }
    }

    /// Takes a waiting sandbox of `key` out of the pool; on the first try, records the claim
    /// (its result counted, its key remembered as demand).
    fn take_waiting(&self, key: &PoolKey, first: bool) -> Option<Waiting> {
        let mut state = self.lock();
        let found = state.waiting.iter().position(|w| &w.key == key);
        if first {
            let now = Instant::now();
            self.forget_old(&mut state, now);
            let result = match found {
                Some(_) => WarmClaim::Hit,
                None if self.sizing.floors.contains_key(key)
                    || state.history.iter().any(|(_, k)| k == key) =>
                {
                    WarmClaim::MissEmpty
                }
                None => WarmClaim::MissNewKey,
            };
            *state
                .claims
                .entry((key.language.clone(), result))
                .or_default() += 1;
            state.history.push_back((now, key.clone()));
            if state.history.len() > MAX_HISTORY {
                state.history.pop_front();
            }
            if found.is_none() {
                // A new or emptied key: the refill looks at it now.
                self.wake.notify_one();
            }
        }
        found.map(|index| state.waiting.swap_remove(index))
    }

    fn forget_old(&self, state: &mut State, now: Instant) {
        while state
            .history
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > self.sizing.window)
        {
            state.history.pop_front();
        }
    }

    /// The targets now: floors, and the window's claims within the budget.
    fn compute_targets(&self, state: &mut State, now: Instant) -> BTreeMap<PoolKey, usize> {
        self.forget_old(state, now);
        let mut claims: BTreeMap<&PoolKey, usize> = BTreeMap::new();
        for (_, key) in &state.history {
            *claims.entry(key).or_default() += 1;
        }
        let mut keys: BTreeSet<&PoolKey> = self.sizing.floors.keys().collect();
        keys.extend(claims.keys().copied());
        let demands: Vec<Demand<PoolKey>> = keys
            .into_iter()
            .map(|key| Demand {
                key: key.clone(),
                floor: self.sizing.floors.get(key).copied().unwrap_or(0),
                claims: claims.get(key).copied().unwrap_or(0),
                cost_mb: self.cost_mb(key),
            })
            .collect();
        pool_sizing::targets(&demands, self.sizing.budget_mb, MAX_PER_KEY)
    }

    /// Drops what waits beyond its key's target (oldest first: their watchers remove them),
    /// then names the key to start a sandbox of next: the one furthest below its target (what
    /// waits and what is starting) that is not backing off and fits the budget (a floor always
    /// fits). The start is counted until the returned [`Starting`] is dropped.
    pub(super) fn next_to_start(self: &Arc<Self>) -> Option<Starting> {
        let key = self.next_key()?;
        *self.lock().starting.entry(key.clone()).or_default() += 1;
        Some(Starting {
            pool: Arc::clone(self),
            key,
        })
    }

    /// Starts of `key` in flight.
    pub(super) fn starting_of(&self, key: &PoolKey) -> usize {
        self.lock().starting.get(key).copied().unwrap_or(0)
    }

    fn next_key(&self) -> Option<PoolKey> {
        let mut state = self.lock();
        let now = Instant::now();
        let targets = self.compute_targets(&mut state, now);
        let mut have: BTreeMap<PoolKey, usize> = BTreeMap::new();
        let mut kept = Vec::with_capacity(state.waiting.len());
        // Newest last in `waiting`: keep the newest ones, so a draining key's oldest go first.
        for waiting in std::mem::take(&mut state.waiting).into_iter().rev() {
            let count = have.entry(waiting.key.clone()).or_default();
            if *count < targets.get(&waiting.key).copied().unwrap_or(0) {
                *count += 1;
                kept.push(waiting);
            }
        }
        kept.reverse();
        state.waiting = kept;
        state.failing.retain(|key, _| targets.contains_key(key));
        state.retry.retain(|key, _| targets.contains_key(key));
        let mut held: u64 = state.waiting.iter().map(|w| self.cost_mb(&w.key)).sum();
        for (key, count) in &state.starting {
            *have.entry(key.clone()).or_default() += count;
            held += self.cost_mb(key) * *count as u64;
        }
        let next = targets
            .iter()
            .filter(|(key, target)| have.get(*key).copied().unwrap_or(0) < **target)
            .filter(|(key, _)| state.retry.get(*key).is_none_or(|(at, _)| now >= *at))
            .filter(|(key, _)| {
                let floor = self.sizing.floors.get(*key).copied().unwrap_or(0);
                have.get(*key).copied().unwrap_or(0) < floor
                    || held + self.cost_mb(key) <= self.sizing.budget_mb
            })
            .max_by_key(|(key, target)| **target - have.get(*key).copied().unwrap_or(0))
            .map(|(key, _)| key.clone());
        state.targets = targets;
        next
    }

    /// Whether a sandbox id is the pool's (waiting, or claimed and not yet removed).
    pub fn holds(&self, id: &str) -> bool {
        self.lock().members.contains(id)
    }

    /// For `/readyz`: `Ok` with what waits, or why starting sandboxes fails.
    pub fn readiness(&self) -> Result<String, String> {
        if !self.enabled() {
            return Ok("off".to_owned());
        }
        let failing: Vec<String> = self
            .lock()
            .failing
            .iter()
            .map(|(key, cause)| format!("{} {} MB: {cause}", key.language, key.memory_mb))
            .collect();
        if !failing.is_empty() {
            return Err(format!(
                "starting pooled sandboxes fails ({}); those executions run cold",
                failing.join("; ")
            ));
        }
        let waiting: Vec<String> = self
            .waiting()
            .iter()
            .map(|(language, count)| format!("{language}={count}"))
            .collect();
        Ok(format!("waiting: {}", waiting.join(" ")))
    }

    /// Every key waiting or wanted: its waiting sandboxes and its target.
    pub fn keys(&self) -> Vec<KeyCount> {
        let state = self.lock();
        let mut counts: BTreeMap<&PoolKey, (usize, usize)> = state
            .targets
            .iter()
            .map(|(key, target)| (key, (0, *target)))
            .collect();
        for waiting in &state.waiting {
            counts.entry(&waiting.key).or_default().0 += 1;
        }
        counts
            .into_iter()
            .map(|(key, (waiting, target))| KeyCount {
                refill: self.restore.refill_of(key, &self.waits(key)),
                key: key.clone(),
                waiting,
                target,
            })
            .collect()
    }

    /// Resolves once starting sandboxes works again after a failure (for the reaper).
    pub async fn recovered(&self) {
        self.recovered.notified().await;
    }

    /// Waiting sandboxes per language (for metrics and benches).
    pub fn waiting(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = self
            .sizing
            .languages
            .iter()
            .map(|l| (l.clone(), 0))
            .collect();
        for waiting in &self.lock().waiting {
            *counts.entry(waiting.key.language.clone()).or_default() += 1;
        }
        counts
    }

    /// Container memory all waiting sandboxes hold together, bytes.
    pub fn waiting_memory_bytes(&self) -> u64 {
        let mb: u64 = self
            .lock()
            .waiting
            .iter()
            .map(|w| self.cost_mb(&w.key))
            .sum();
        mb * 1024 * 1024
    }

    /// Claims so far, what waits and its memory (for `/metrics` and benches).
    pub fn snapshot(&self) -> WarmSnapshot {
        // Not in the struct expression: its guard would live to the end of it and `waiting`
        // would lock again.
        let claims = self.lock().claims.clone();
        WarmSnapshot {
            claims,
            waiting: self.waiting(),
            waiting_memory_bytes: self.waiting_memory_bytes(),
        }
    }

    pub(super) fn waits(&self, key: &PoolKey) -> Waits {
        match (key.serves, key.language.as_str()) {
            (Serves::Session, language) => {
                Waits::Session(SessionRunner::for_language(language).unwrap_or(SessionRunner::Bash))
            }
            (Serves::Execution, "python") => Waits::Pool(PoolRunner::Python {
                preload: self.preload.clone(),
            }),
            (Serves::Execution, _) => Waits::Pool(PoolRunner::Plain),
        }
    }

    /// Records the result of a start; a failure is logged once per cause, not per attempt.
    pub(super) fn started(&self, key: &PoolKey, result: Result<(), String>) {
        let mut state = self.lock();
        match result {
            Ok(()) => {
                state.retry.remove(key);
                if state.failing.remove(key).is_some() {
                    tracing::info!(language = %key.language, "warm pool: starting sandboxes works again");
                    self.recovered.notify_one();
                }
            }
            Err(cause) => {
                if state.failing.get(key) != Some(&cause) {
                    tracing::warn!(language = %key.language, memory_mb = key.memory_mb, error = %cause, "warm pool: starting a sandbox failed; executions run cold until it works");
                }
                state.failing.insert(key.clone(), cause);
                let backoff = state
                    .retry
                    .get(key)
                    .map_or(FIRST_BACKOFF, |(_, last)| (*last * 2).min(MAX_BACKOFF));
                state
                    .retry
                    .insert(key.clone(), (Instant::now() + backoff, backoff));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::pool_key::tests::runnable;

    #[test]
    fn the_preload_allowance_is_the_pools_cost_for_python_executions_only() {
        let pool = WarmPool::new(
            Sizing {
                floors: BTreeMap::new(),
                window: Duration::from_secs(600),
                budget_mb: 2048,
                languages: BTreeSet::from(["python".to_owned()]),
            },
            vec!["json".to_owned()],
            None,
            false,
        );
        let execution = PoolKey::of("python", Serves::Execution, &runnable(128, &[]));
        let session = PoolKey::of("python", Serves::Session, &runnable(128, &[]));
        assert_eq!(pool.cost_mb(&execution), 128 + PRELOAD_MEMORY_MB);
        assert_eq!(pool.cost_mb(&session), 128);
    }

    #[tokio::test]
    async fn starts_in_flight_count_as_waiting_until_they_end() {
        let pool = WarmPool::new(
            Sizing {
                floors: BTreeMap::new(),
                window: Duration::from_secs(600),
                budget_mb: 2048,
                languages: BTreeSet::from(["python".to_owned()]),
            },
            Vec::new(),
            None,
            false,
        );
        let key = PoolKey::of("python", Serves::Execution, &runnable(256, &[]));
        assert!(pool.claim(&key).await.is_none());
        assert!(pool.claim(&key).await.is_none());
        // Target 2: two starts may be in flight at once, not a third.
        let first = pool.next_to_start().unwrap();
        let second = pool.next_to_start().unwrap();
        assert_eq!((&first.key, &second.key), (&key, &key));
        assert!(pool.next_to_start().is_none());
        drop(first);
        assert!(pool.next_to_start().is_some());
    }

    #[tokio::test]
    async fn claims_are_counted_and_make_their_key_wanted() {
        let pool = WarmPool::new(
            Sizing {
                floors: BTreeMap::new(),
                window: Duration::from_secs(600),
                budget_mb: 2048,
                languages: BTreeSet::from(["python".to_owned()]),
            },
            Vec::new(),
            None,
            false,
        );
        let key = PoolKey::of("python", Serves::Execution, &runnable(256, &[]));
        assert!(pool.claim(&key).await.is_none());
        assert!(pool.claim(&key).await.is_none());
        let starting = pool.next_to_start().map(|s| s.key.clone());
        assert_eq!(starting, Some(key.clone()));
        let claims = pool.snapshot().claims;
        assert_eq!(claims[&("python".to_owned(), WarmClaim::MissNewKey)], 1);
        assert_eq!(claims[&("python".to_owned(), WarmClaim::MissEmpty)], 1);
        let keys = pool.keys();
        assert_eq!(keys.len(), 1);
        assert_eq!((keys[0].waiting, keys[0].target), (0, 2));
    }
}
