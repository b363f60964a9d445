//! The reaper: on start and then periodically, removes sandbox containers this gateway instance
//! no longer tracks (a crash, a kill -9, a wedged runsc) or that outlived their deadline, and
//! closes the execution records they left open as `error`, with a reason.
//!
//! It only touches its own instance's containers (label `sandgate.instance`, whose value is kept
//! in the data directory and so survives restarts): one gateway per data directory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::App;
use crate::runtime::Owner;

/// Time between two sweeps.
pub const INTERVAL: Duration = Duration::from_secs(30);
/// How long past its deadline a tracked sandbox may still exist before it is destroyed anyway.
const GRACE: Duration = Duration::from_secs(30);
/// Why a record is closed: at the first sweep, what an earlier process of this gateway left
/// open (it restarted or crashed before recording the end); later, a run this process lost
/// track of without recording its end (the audit store and the local journal both refused it).
/// A record whose end waits in the journal is never closed: the replay writes the real end.
const LEFT_BY_RESTART: &str = "the gateway restarted or crashed before this execution's end was \
    recorded; its sandbox was removed";
const END_NOT_STORED: &str = "this gateway lost track of this execution before its end was \
    recorded (the audit store and the local journal both refused it, or its task failed); its \
    sandbox was removed";

/// One execution in flight: its deadline once its sandbox has started, and how to cancel it.
#[derive(Debug, Clone)]
struct Live {
    deadline: Option<Instant>,
    cancel: CancellationToken,
    /// Which guard owns the entry.
    generation: u64,
}

impl Live {
    fn new(cancel: &CancellationToken, generation: u64) -> Live {
        Live {
            deadline: None,
            cancel: cancel.clone(),
            generation,
        }
    }
}

/// Executions this process is running.
#[derive(Debug, Default)]
pub struct LiveSet {
    inner: Mutex<HashMap<String, Live>>,
    generations: std::sync::atomic::AtomicU64,
}

impl LiveSet {
    /// Tracks `id` (a fresh execution id) until the returned guard is dropped.
    pub fn track(self: &Arc<Self>, id: &str) -> LiveGuard {
        let guard = self.guard(id);
        self.lock()
            .insert(id.to_owned(), Live::new(&guard.cancel, guard.generation));
        guard
    }

    fn guard(self: &Arc<Self>, id: &str) -> LiveGuard {
        LiveGuard {
            set: Arc::clone(self),
            id: id.to_owned(),
            cancel: CancellationToken::new(),
            generation: self
                .generations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Tracks `id` unless something already does (two approvals of one request at once):
    /// `None` then, and the existing entry is left alone.
    pub fn try_track(self: &Arc<Self>, id: &str) -> Option<LiveGuard> {
        let guard = self.guard(id);
        let mut set = self.lock();
        if set.contains_key(id) {
            drop(set);
            // Dropping `guard` leaves the existing entry alone: its generation differs.
            return None;
        }
        set.insert(id.to_owned(), Live::new(&guard.cancel, guard.generation));
        drop(set);
        Some(guard)
    }

    /// Cancels a live execution; false if it is not running here.
    pub fn cancel(&self, id: &str) -> bool {
        match self.lock().get(id) {
            Some(live) => {
                live.cancel.cancel();
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The executions tracked now.
    pub fn ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `None`: not tracked; `Some(None)`: tracked, its sandbox not started yet.
    fn deadline(&self, id: &str) -> Option<Option<Instant>> {
        self.lock().get(id).map(|live| live.deadline)
    }
}

/// Keeps an execution in the live set while it exists.
#[derive(Debug)]
pub struct LiveGuard {
    set: Arc<LiveSet>,
    id: String,
    cancel: CancellationToken,
    generation: u64,
}

impl LiveGuard {
    pub fn started(&self, timeout: Duration) {
        if let Some(live) = self.set.lock().get_mut(&self.id) {
            live.deadline = Some(Instant::now() + timeout);
        }
    }

    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

impl Drop for LiveGuard {
    /// Removes the entry only if it is still this guard's.
    fn drop(&mut self) {
        let mut set = self.set.lock();
        if set
            .get(&self.id)
            .is_some_and(|live| live.generation == self.generation)
        {
            set.remove(&self.id);
        }
    }
}

/// Sweeps once at start, then every [`INTERVAL`] and whenever the pool's starts work again
/// after failing (a dockerd restart: the sandboxes it killed could not be removed while it was
/// away), until shutdown.
pub async fn run(app: Arc<App>) {
    let mut first = true;
    loop {
        let report = sweep(&app, first).await;
        first = false;
        if report.containers > 0 || report.records > 0 || report.output_areas > 0 {
            tracing::warn!(
                containers = report.containers,
                records = report.records,
                output_areas = report.output_areas,
                "reaped"
            );
        }
        if report.purged > 0 {
            tracing::info!(executions = report.purged, "payloads purged by retention");
        }
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tokio::time::sleep(INTERVAL) => {}
            () = app.pool.recovered() => {
                tracing::info!("the runtime works again: sweeping what it left");
            }
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct SweepReport {
    pub containers: usize,
    pub records: u64,
    /// `/output` areas left mounted by a crash.
    pub output_areas: usize,
    /// Executions whose payload retention purged.
    pub purged: usize,
}

/// The sandbox id a container name carries (`sandgate-<id>`).
fn sandbox_id(name: &str) -> &str {
    name.strip_prefix("sandgate-").unwrap_or(name)
}

/// One sweep; `first` is the one at start-up (see [`LEFT_BY_RESTART`]).
pub async fn sweep(app: &App, first: bool) -> SweepReport {
    let mut report = SweepReport::default();
    match app.runtime.list().await {
        Ok(sandboxes) => {
            for sandbox in sandboxes {
                if sandbox.instance.as_deref() != Some(app.instance.as_str()) {
                    continue;
                }
                // Asked now, after the listing: a sandbox is created only once its execution
                // is tracked (or the pool holds its id), so one that is listed and neither
                // tracked nor held has no owner.
                let keep = match &sandbox.owner {
                    Owner::Execution(id) => match app.live.deadline(id) {
                        Some(Some(deadline)) => Instant::now() < deadline + GRACE,
                        Some(None) => true,
                        None => false,
                    },
                    Owner::Pool { .. } => app.pool.holds(sandbox_id(&sandbox.name)),
                };
                if keep {
                    continue;
                }
                match app.runtime.destroy(&sandbox.container_id).await {
                    Ok(()) => report.containers += 1,
                    Err(err) => tracing::error!(
                        container = %sandbox.name,
                        error = %err,
                        "reaper could not remove a sandbox"
                    ),
                }
            }
        }
        Err(err) => tracing::warn!(error = %err, "reaper cannot list sandboxes"),
    }
    let why = if first {
        LEFT_BY_RESTART
    } else {
        END_NOT_STORED
    };
    if first {
        // Sessions do not outlive their gateway: the previous run's are closed now, and their
        // containers (no longer live) were removed above.
        app.close_sessions_left().await;
    }
    let owned = |id: &str| app.live.contains(id) || app.audit.journal_holds(id);
    match app.audit.close_abandoned(&app.instance, owned, why).await {
        Ok(closed) => report.records = closed,
        Err(err) => tracing::warn!(error = %err, "reaper cannot close abandoned records"),
    }
    let scratch = app.scratch_root.clone();
    let egress = app.egress_root.clone();
    let live = Arc::clone(&app.live);
    let pool = Arc::clone(&app.pool);
    report.output_areas = tokio::task::spawn_blocking(move || {
        let is_live = |id: &str| live.contains(id) || pool.holds(id);
        crate::outputs::sweep(&scratch, is_live) + super::home::sweep_egress(&egress, is_live)
    })
    .await
    .unwrap_or(0);
    match app.purge_payloads(crate::ids::now_micros()).await {
        Ok(purged) => report.purged = purged,
        Err(err) => tracing::warn!(error = %err, "retention purge failed"),
    }
    app.expire_snapshots().await;
    report
}
