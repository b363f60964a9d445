//! The warm pool: sandboxes started ahead, waiting with a resident runner (`sandbox-init pool`;
//! Python's imports `python_preload` first) or, for sessions, a session runner waiting for its
//! opening line. An execution or session whose decision the pool has a sandbox for claims it
//! instead of starting its own; every other starts cold.
//!
//! A waiting sandbox is keyed by the whole container its decision implies ([`PoolKey`]):
//! image, runtime, memory, CPU, pids, disk (which also sizes the `/workspace` and `/tmp`
//! tmpfs), the dataset mounts exactly as granted (read-only; a waiting sandbox has those and no
//! other), and whether it serves an execution or a session. runsc cannot change a live
//! sandbox's limits (`docker update` fails: runsc has no `update` command), so a claim takes a
//! sandbox of exactly its key; nothing is widened. Whether the decision grants network does
//! not change the container (network `none` and the socket directory either way; the grant is
//! the listener served at the claim), so it is not part of the key. The deadline and output cap
//! are the run's, set at the claim.
//!
//! How many of each key wait is demand-driven ([`super::pool_sizing`]): keys claimed in the
//! last `warm_pool_window_s` keep sandboxes in proportion to their claims within
//! `warm_pool_memory_mb` for all waiting sandboxes together; `warm_pool` is the floor for the
//! configured default shape; a key no longer claimed drains.
//!
//! Memory: a cold container's limit is the decision's `memory_mb`. A pooled Python sandbox with
//! a preload gets [`PRELOAD_MEMORY_MB`] on top, for what the waiting interpreter imported: the
//! program keeps what the decision granted, and the budget counts the whole container.
//!
//! One sandbox serves one execution (or one session) and is then removed: nothing of one run
//! reaches another. Waiting sandboxes take no execution slot; the refill starts one sandbox at
//! a time and only while nothing waits for a slot and fewer than half the slots run
//! (`Scheduler::is_quiet`), so it never delays a queued execution and leaves CPU to the running
//! ones.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::{oneshot, Notify};

use policy_engine::Limits;

use super::floor::Runnable;
use super::home::SandboxHome;
use super::pool_sizing::{self, Demand};
use super::App;
use crate::metrics::{WarmClaim, WarmSnapshot};
use crate::runtime::{
    Job, Owner, PoolRunner, Ran, ReadOnlyMount, RunControl, RuntimeError, Sandbox, SessionRunner,
    TurnRan, Waits,
};

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
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// What a sandbox is created with (the caller adds a decision's dataset mounts).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub image: String,
    pub runtime: String,
    /// Memory, CPU, pids and disk; the deadline and output cap are zero (they are the run's).
    pub limits: Limits,
}

impl Shape {
    pub(super) fn of(runnable: &Runnable) -> Shape {
        Shape {
            image: runnable.image.clone(),
            runtime: runnable.runtime.clone(),
            limits: Limits {
                timeout_ms: 0,
                output_bytes: 0,
                cpus: nano_rounded(runnable.limits.cpus),
                ..runnable.limits.clone()
            },
        }
    }
}

/// CPUs as Docker takes them (whole nano-CPUs), so equal quotas compare equal.
pub fn nano_rounded(cpus: f64) -> f64 {
    (cpus * 1e9).round() / 1e9
}

fn nano_cpus(cpus: f64) -> u64 {
    (cpus * 1e9).round().max(0.0) as u64
}

/// What a waiting sandbox will serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Serves {
    /// One execution (`sandbox-init pool`).
    Execution,
    /// One session (`sandbox-init session`), waiting for its opening line.
    Session,
}

/// A granted dataset as the key holds it: host source and `/data/...` target, read-only.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MountKey {
    pub source: PathBuf,
    pub target: String,
}

/// The whole container a decision implies; a claim takes a sandbox of exactly this key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub language: String,
    pub serves: Serves,
    pub image: String,
    pub runtime: String,
    pub memory_mb: u64,
    pub nano_cpus: u64,
    pub pids: u64,
    /// Also the size of the `/workspace` and `/tmp` tmpfs.
    pub disk_mb: u64,
    /// In the order granted.
    pub mounts: Vec<MountKey>,
}

impl PoolKey {
    pub(super) fn of(language: &str, serves: Serves, runnable: &Runnable) -> PoolKey {
        let shape = Shape::of(runnable);
        let mut key = PoolKey::of_shape(language, serves, &shape);
        key.mounts = runnable
            .mounts
            .iter()
            .map(|m| MountKey {
                source: m.source.clone(),
                target: m.target.clone(),
            })
            .collect();
        key
    }

    /// A key without dataset mounts (the configured default shape).
    pub fn of_shape(language: &str, serves: Serves, shape: &Shape) -> PoolKey {
        PoolKey {
            language: language.to_owned(),
            serves,
            image: shape.image.clone(),
            runtime: shape.runtime.clone(),
            memory_mb: shape.limits.memory_mb,
            nano_cpus: nano_cpus(shape.limits.cpus),
            pids: shape.limits.pids,
            disk_mb: shape.limits.disk_mb,
            mounts: Vec::new(),
        }
    }

    /// The container's shape (its mounts are [`PoolKey::mounts`]).
    pub fn shape(&self) -> Shape {
        Shape {
            image: self.image.clone(),
            runtime: self.runtime.clone(),
            limits: Limits {
                timeout_ms: 0,
                output_bytes: 0,
                memory_mb: self.memory_mb,
                cpus: self.nano_cpus as f64 / 1e9,
                pids: self.pids,
                disk_mb: self.disk_mb,
            },
        }
    }

    fn read_only_mounts(&self) -> Vec<ReadOnlyMount> {
        self.mounts
            .iter()
            .map(|m| ReadOnlyMount {
                source: m.source.clone(),
                target: m.target.clone(),
            })
            .collect()
    }

    /// For `/readyz` and logs.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "language": self.language,
            "serves": match self.serves { Serves::Execution => "execution", Serves::Session => "session" },
            "image": self.image,
            "memory_mb": self.memory_mb,
            "cpus": self.nano_cpus as f64 / 1e9,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "mounts": self.mounts.iter().map(|m| serde_json::json!({"source": m.source, "target": m.target})).collect::<Vec<_>>(),
        })
    }
}

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
}

type ClaimReply = oneshot::Sender<Claimed>;

#[derive(Debug)]
struct Waiting {
    key: PoolKey,
    claim: oneshot::Sender<ClaimReply>,
}

#[derive(Debug, Default)]
struct State {
    waiting: Vec<Waiting>,
    /// Ids of every sandbox the pool started that still exists (waiting or claimed).
    members: BTreeSet<String>,
    /// Claims in the window, oldest first.
    history: VecDeque<(Instant, PoolKey)>,
    /// The targets last computed (for `/readyz`).
    targets: BTreeMap<PoolKey, usize>,
    /// Claims so far per language and result (`sandgate_warm_claims_total`).
    claims: BTreeMap<(String, WarmClaim), u64>,
    /// Per key: why its last start failed (absent while its starts succeed).
    failing: BTreeMap<PoolKey, String>,
    /// Per failing key: not retried before this, and the next back-off.
    retry: BTreeMap<PoolKey, (Instant, Duration)>,
}

/// One line of `/readyz`'s `warm_pool.keys`.
#[derive(Debug, Clone)]
pub struct KeyCount {
    pub key: PoolKey,
    pub waiting: usize,
    pub target: usize,
}

#[derive(Debug)]
pub struct WarmPool {
    sizing: Sizing,
    preload: Vec<String>,
    state: Mutex<State>,
    wake: Notify,
    /// Signalled when starting sandboxes works again after failing (dockerd came back): what
    /// could not be removed while it was away is swept now, not at the next periodic sweep.
    recovered: Notify,
}

impl WarmPool {
    pub fn new(sizing: Sizing, preload: Vec<String>) -> Arc<WarmPool> {
        let targets = sizing.floors.clone();
        Arc::new(WarmPool {
            sizing,
            preload,
            state: Mutex::new(State {
                targets,
                ..State::default()
            }),
            wake: Notify::new(),
            recovered: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
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
    /// then names the key to start a sandbox of next: the one furthest below its target that
    /// is not backing off and fits the budget (a floor always fits).
    fn next_to_start(&self) -> Option<PoolKey> {
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
        let held: u64 = state.waiting.iter().map(|w| self.cost_mb(&w.key)).sum();
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

    fn waits(&self, key: &PoolKey) -> Waits {
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
    fn started(&self, key: &PoolKey, result: Result<(), String>) {
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

/// Keeps every key at its target until shutdown, one start at a time, only while an execution
/// slot is free; a key whose starts fail is retried with back-off (1 s doubling to 30 s) while
/// the others go on.
pub async fn refill(app: Arc<App>) {
    let pool = Arc::clone(&app.pool);
    if !pool.enabled() {
        return;
    }
    loop {
        let next = if app.scheduler.is_quiet() {
            pool.next_to_start()
        } else {
            None
        };
        let idle = match next {
            Some(key) => {
                let started = start_one(&app, &pool, key.clone()).await;
                pool.started(&key, started);
                false
            }
            None => true,
        };
        if idle {
            tokio::select! {
                () = app.shutdown.cancelled() => return,
                () = pool.wake.notified() => {}
                () = tokio::time::sleep(IDLE_CHECK) => {}
            }
        } else if app.shutdown.is_cancelled() {
            return;
        }
    }
}

/// Starts one sandbox of `key` and leaves it waiting, watched, in the pool.
async fn start_one(app: &Arc<App>, pool: &Arc<WarmPool>, key: PoolKey) -> Result<(), String> {
    let id = crate::ids::new("sb");
    // Known to the reaper before anything of it exists on the host.
    pool.lock().members.insert(id.clone());
    let home = match SandboxHome::create(&app.egress_root, &app.scratch_root, &id, key.disk_mb) {
        Ok(home) => home,
        Err(err) => {
            pool.lock().members.remove(&id);
            return Err(format!("preparing the sandbox's host directories: {err}"));
        }
    };
    let owner = Owner::Pool {
        language: key.language.clone(),
    };
    let mut plan = app.plan(&id, owner, &key.shape(), &home, pool.waits(&key));
    plan.mounts = key.read_only_mounts();
    // The waiting interpreter's imports must not eat into what the decision grants the
    // program: the container gets room for them on top (see PRELOAD_MEMORY_MB).
    plan.limits.memory_mb = pool.cost_mb(&key);
    let sandbox = match app.runtime.start(plan).await {
        Ok(sandbox) => sandbox,
        Err(err) => {
            home.remove();
            pool.lock().members.remove(&id);
            return Err(super::error_chain(&err));
        }
    };
    let (claim, claims) = oneshot::channel();
    {
        let mut state = pool.lock();
        // Still wanted (the demand may have moved while it started)? Else dropping `claim`
        // removes it.
        let target = state.targets.get(&key).copied().unwrap_or(0);
        let have = state.waiting.iter().filter(|w| w.key == key).count();
        if have < target {
            state.waiting.push(Waiting { key, claim });
        }
    }
    let watched = Watched {
        pool: Arc::clone(pool),
        sandbox,
        home,
    };
    app.tasks
        .spawn(watched.watch(claims, app.shutdown.child_token()));
    Ok(())
}

/// A waiting sandbox's keeper: hands it to the claim, or removes it if it dies, is dropped
/// from the pool, or the gateway shuts down.
struct Watched {
    pool: Arc<WarmPool>,
    sandbox: Box<dyn Sandbox>,
    home: SandboxHome,
}

enum Event {
    Claim(Result<ClaimReply, oneshot::error::RecvError>),
    Died,
    Shutdown,
}

impl Watched {
    async fn watch(
        mut self,
        mut claims: oneshot::Receiver<ClaimReply>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        // Death first: a sandbox whose end is already known is never handed out.
        let event = tokio::select! {
            biased;
            () = self.sandbox.closed() => Event::Died,
            () = shutdown.cancelled() => Event::Shutdown,
            claim = &mut claims => Event::Claim(claim),
        };
        // From here the pool's entry for this sandbox can no longer be claimed.
        drop(claims);
        match event {
            Event::Claim(Ok(reply)) => {
                let Watched {
                    pool,
                    sandbox,
                    home,
                } = self;
                if let Err(unclaimed) = reply.send(Claimed { sandbox, home }) {
                    Watched {
                        pool,
                        sandbox: unclaimed.sandbox,
                        home: unclaimed.home,
                    }
                    .remove()
                    .await;
                }
            }
            Event::Died => {
                tracing::warn!(sandbox = %self.home.id, "a pooled sandbox ended while waiting; removed");
                self.pool.wake.notify_one();
                self.remove().await;
            }
            Event::Claim(Err(_)) | Event::Shutdown => self.remove().await,
        }
    }

    async fn remove(self) {
        let id = self.home.id.clone();
        {
            // A sandbox that died is no longer claimable.
            let mut state = self.pool.lock();
            state.waiting.retain(|w| !w.claim.is_closed());
        }
        self.sandbox.discard().await;
        self.home.remove();
        self.pool.lock().members.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runnable(memory_mb: u64, mounts: &[&str]) -> Runnable {
        Runnable {
            backend: "gvisor".into(),
            runtime: "runsc".into(),
            image: "sandgate/python".into(),
            limits: Limits {
                timeout_ms: 30_000,
                memory_mb,
                cpus: 0.5,
                pids: 256,
                disk_mb: 64,
                output_bytes: 1024,
            },
            mounts: mounts
                .iter()
                .map(|name| ReadOnlyMount {
                    source: PathBuf::from(format!("/srv/{name}")),
                    target: format!("/data/{name}"),
                })
                .collect(),
            network: None,
        }
    }

    #[test]
    fn the_key_is_the_whole_container_and_nothing_else() {
        let small = PoolKey::of("python", Serves::Execution, &runnable(256, &[]));
        assert_eq!(
            small.memory_mb, 256,
            "Python under 512 MB is a key like any other"
        );
        assert_eq!(small.nano_cpus, 500_000_000);
        // The deadline and output cap are the run's, not the container's.
        let mut later = runnable(256, &[]);
        later.limits.timeout_ms = 1;
        later.limits.output_bytes = 1;
        assert_eq!(PoolKey::of("python", Serves::Execution, &later), small);
        let census = PoolKey::of("python", Serves::Execution, &runnable(256, &["census"]));
        assert_ne!(census, small);
        assert_eq!(census.read_only_mounts().len(), 1);
        assert_ne!(
            census,
            PoolKey::of("python", Serves::Execution, &runnable(256, &["survey"]))
        );
        assert_ne!(
            small,
            PoolKey::of("python", Serves::Session, &runnable(256, &[]))
        );
        assert_eq!(small.shape().limits.cpus, 0.5);
    }

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
        );
        let execution = PoolKey::of("python", Serves::Execution, &runnable(128, &[]));
        let session = PoolKey::of("python", Serves::Session, &runnable(128, &[]));
        assert_eq!(pool.cost_mb(&execution), 128 + PRELOAD_MEMORY_MB);
        assert_eq!(pool.cost_mb(&session), 128);
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
        );
        let key = PoolKey::of("python", Serves::Execution, &runnable(256, &[]));
        assert!(pool.claim(&key).await.is_none());
        assert!(pool.claim(&key).await.is_none());
        assert_eq!(pool.next_to_start(), Some(key.clone()));
        let claims = pool.snapshot().claims;
        assert_eq!(claims[&("python".to_owned(), WarmClaim::MissNewKey)], 1);
        assert_eq!(claims[&("python".to_owned(), WarmClaim::MissEmpty)], 1);
        let keys = pool.keys();
        assert_eq!(keys.len(), 1);
        assert_eq!((keys[0].waiting, keys[0].target), (0, 2));
    }
}
