//! The warm pool: sandboxes started ahead, per language, waiting with a resident
//! runner (`sandbox-init pool`; Python's imports `python_preload` first). An execution whose
//! decision the pool can serve claims one instead of starting its own; every other goes cold.
//!
//! What a claim may serve: no dataset mounts, and the same image, runtime, memory, CPU, pids
//! and disk the waiting sandbox was created with (its *shape*): runsc cannot change a live
//! sandbox's limits (`docker update` fails: runsc has no `update` command), so pools are keyed
//! by shape. Each language's pool is started with the shape last asked for (at first
//! `warm_pool_limits`); a request of another shape runs cold and re-shapes the pool, so an
//! agent that keeps asking for the same limits gets warm runs from its second call on. The
//! deadline and the output cap are the run's, set at the claim.
//!
//! One sandbox serves one execution and is then removed: nothing of one run reaches another.
//! Waiting sandboxes take no execution slot; the refill starts one sandbox at a time and only
//! while nothing waits for a slot and fewer than half the slots run (`Scheduler::is_quiet`),
//! so it never delays a queued execution and leaves CPU to the running ones.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::{oneshot, Notify};

use policy_engine::Limits;

use super::floor::Runnable;
use super::home::SandboxHome;
use super::App;
use crate::runtime::{Owner, PoolRunner, Sandbox, Waits};

/// Python sandboxes below this memory limit run cold: the preload would more than double them.
pub const MIN_PYTHON_POOL_MEMORY_MB: u64 = 512;
/// Memory a pooled Python container gets on top of the decision's, for what the waiting
/// interpreter imported (numpy, pandas and matplotlib hold about 150 MB under gVisor): the
/// program has what the decision granted, as it would cold. Without a preload, none.
pub const PRELOAD_MEMORY_MB: u64 = 192;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// What a waiting sandbox was created with and a claim must match exactly.
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

/// A claimed sandbox: the execution's from now on.
#[derive(Debug)]
pub struct Claimed {
    pub sandbox: Box<dyn Sandbox>,
    pub home: SandboxHome,
    /// Keeps the sandbox known to the reaper until the execution is done with it.
    pub member: Option<Member>,
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

type ClaimReply = oneshot::Sender<Claimed>;

#[derive(Debug)]
struct Waiting {
    language: String,
    shape: Shape,
    claim: oneshot::Sender<ClaimReply>,
}

#[derive(Debug, Default)]
struct State {
    /// The shape each language's sandboxes are started with.
    wanted: BTreeMap<String, Shape>,
    waiting: Vec<Waiting>,
    /// Ids of every sandbox the pool started that still exists (waiting or claimed).
    members: BTreeSet<String>,
    /// Per language: why its last start failed (absent while its starts succeed).
    failing: BTreeMap<String, String>,
    /// Per failing language: not retried before this, and the next back-off.
    retry: BTreeMap<String, (Instant, Duration)>,
}

#[derive(Debug)]
pub struct WarmPool {
    targets: BTreeMap<String, usize>,
    preload: Vec<String>,
    state: Mutex<State>,
    wake: Notify,
    /// Signalled when starting sandboxes works again after failing (dockerd came back): what
    /// could not be removed while it was away is swept now, not at the next periodic sweep.
    recovered: Notify,
}

impl WarmPool {
    /// A pool of `targets` sandboxes per language, each language first shaped as `seed` says.
    pub fn new(
        targets: BTreeMap<String, usize>,
        preload: Vec<String>,
        seed: impl Fn(&str) -> Option<Shape>,
    ) -> Arc<WarmPool> {
        let targets: BTreeMap<String, usize> = targets
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .collect();
        let wanted = targets
            .keys()
            .filter_map(|language| Some((language.clone(), seed(language)?)))
            .collect();
        Arc::new(WarmPool {
            targets,
            preload,
            state: Mutex::new(State {
                wanted,
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
        !self.targets.is_empty()
    }

    /// Whether the pool may serve this decision at all.
    pub(super) fn serves(&self, language: &str, runnable: &Runnable) -> bool {
        self.targets.contains_key(language)
            && runnable.mounts.is_empty()
            && (language != "python" || runnable.limits.memory_mb >= MIN_PYTHON_POOL_MEMORY_MB)
    }

    /// A waiting sandbox of exactly this decision's shape, if one is ready. A miss re-shapes
    /// the language's pool to this decision. Never hands out a sandbox that died waiting.
    pub(super) async fn claim(
        self: &Arc<Self>,
        language: &str,
        runnable: &Runnable,
    ) -> Option<Claimed> {
        if !self.serves(language, runnable) {
            return None;
        }
        let shape = Shape::of(runnable);
        loop {
            let waiting = {
                let mut state = self.lock();
                let found = state
                    .waiting
                    .iter()
                    .position(|w| w.language == language && w.shape == shape);
                match found {
                    Some(index) => state.waiting.swap_remove(index),
                    None => {
                        self.reshape(&mut state, language, shape);
                        return None;
                    }
                }
            };
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
                claimed.member = Some(Member {
                    pool: Arc::clone(self),
                    id: claimed.home.id.clone(),
                });
                return Some(claimed);
            }
        }
    }

    /// From now on `language` is started with `shape`. Sandboxes already waiting in another
    /// shape stay claimable; the refill replaces them one by one (oldest first) as it starts
    /// sandboxes of the new shape, so two shapes in turn each still find warm ones.
    fn reshape(&self, state: &mut State, language: &str, shape: Shape) {
        if state.wanted.get(language) == Some(&shape) {
            return;
        }
        tracing::info!(language, limits = ?shape.limits, "warm pool re-shaped");
        state.wanted.insert(language.to_owned(), shape);
        self.wake.notify_one();
    }

    /// Makes room for one more sandbox of `language`: beyond its target, the oldest waiting one
    /// of another shape is dropped (its watcher removes it).
    fn make_room(&self, state: &mut State, language: &str, shape: &Shape) {
        let target = self.targets.get(language).copied().unwrap_or(0);
        let waiting = state
            .waiting
            .iter()
            .filter(|w| w.language == language)
            .count();
        if waiting < target {
            return;
        }
        if let Some(oldest) = state
            .waiting
            .iter()
            .position(|w| w.language == language && &w.shape != shape)
        {
            state.waiting.remove(oldest);
        }
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
            .map(|(language, cause)| format!("{language}: {cause}"))
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

    /// Resolves once starting sandboxes works again after a failure (for the reaper).
    pub async fn recovered(&self) {
        self.recovered.notified().await;
    }

    /// Waiting sandboxes per language (for metrics and benches).
    pub fn waiting(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> =
            self.targets.keys().map(|l| (l.clone(), 0)).collect();
        for waiting in &self.lock().waiting {
            *counts.entry(waiting.language.clone()).or_default() += 1;
        }
        counts
    }

    /// The next sandbox to start: a language below its target, with its wanted shape.
    fn next_to_start(&self) -> Option<(String, Shape)> {
        let state = self.lock();
        let now = Instant::now();
        self.targets.iter().find_map(|(language, target)| {
            if state.retry.get(language).is_some_and(|(at, _)| now < *at) {
                return None;
            }
            let shape = state.wanted.get(language)?;
            let have = state
                .waiting
                .iter()
                .filter(|w| &w.language == language && &w.shape == shape)
                .count();
            (have < *target).then(|| (language.clone(), shape.clone()))
        })
    }

    fn runner(&self, language: &str) -> PoolRunner {
        match language {
            "python" => PoolRunner::Python {
                preload: self.preload.clone(),
            },
            _ => PoolRunner::Plain,
        }
    }

    /// Records the result of a start; a failure is logged once per cause, not per attempt.
    fn started(&self, language: &str, result: Result<(), String>) {
        let mut state = self.lock();
        match result {
            Ok(()) => {
                state.retry.remove(language);
                if state.failing.remove(language).is_some() {
                    tracing::info!(language, "warm pool: starting sandboxes works again");
                    self.recovered.notify_one();
                }
            }
            Err(cause) => {
                if state.failing.get(language) != Some(&cause) {
                    tracing::warn!(language, error = %cause, "warm pool: starting a sandbox failed; executions run cold until it works");
                }
                state.failing.insert(language.to_owned(), cause);
                let backoff = state
                    .retry
                    .get(language)
                    .map_or(FIRST_BACKOFF, |(_, last)| (*last * 2).min(MAX_BACKOFF));
                state
                    .retry
                    .insert(language.to_owned(), (Instant::now() + backoff, backoff));
            }
        }
    }
}

/// Keeps every language's pool at its target until shutdown, one start at a time, only while
/// an execution slot is free; a language whose starts fail is retried with back-off (1 s
/// doubling to 30 s) while the others go on.
pub async fn refill(app: Arc<App>) {
    let pool = Arc::clone(&app.pool);
    if !pool.enabled() {
        return;
    }
    loop {
        let next = pool.next_to_start().filter(|_| app.scheduler.is_quiet());
        let idle = match next {
            Some((language, shape)) => {
                let started = start_one(&app, &pool, &language, shape).await;
                pool.started(&language, started);
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

/// Starts one sandbox of `shape` and leaves it waiting, watched, in the pool.
async fn start_one(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    language: &str,
    shape: Shape,
) -> Result<(), String> {
    let id = crate::ids::new("sb");
    // Known to the reaper before anything of it exists on the host.
    pool.lock().members.insert(id.clone());
    let home = match SandboxHome::create(
        &app.egress_root,
        &app.scratch_root,
        &id,
        shape.limits.disk_mb,
    ) {
        Ok(home) => home,
        Err(err) => {
            pool.lock().members.remove(&id);
            return Err(format!("preparing the sandbox's host directories: {err}"));
        }
    };
    let mut plan = app.plan(
        &id,
        Owner::Pool {
            language: language.to_owned(),
        },
        &shape,
        &home,
        Waits::Pool(pool.runner(language)),
    );
    // The waiting interpreter's imports must not eat into what the decision grants the
    // program: the container gets room for them on top (see PRELOAD_MEMORY_MB).
    if language == "python" && !pool.preload.is_empty() {
        plan.limits.memory_mb += PRELOAD_MEMORY_MB;
    }
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
        // Re-shaped while it started: not wanted any more (dropping `claim` removes it).
        if state.wanted.get(language) == Some(&shape) {
            pool.make_room(&mut state, language, &shape);
            state.waiting.push(Waiting {
                language: language.to_owned(),
                shape,
                claim,
            });
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
                if let Err(unclaimed) = reply.send(Claimed {
                    sandbox,
                    home,
                    member: None,
                }) {
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
