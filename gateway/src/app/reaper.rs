//! The reaper: on start and then periodically, removes sandbox containers this gateway instance
//! no longer tracks (a crash, a kill -9, a wedged runsc) or that outlived their deadline, and
//! closes the execution records they left open as `error`, with a reason.
//!
//! It only touches its own instance's containers (label `sandgate.instance`, whose value is kept
//! in the data directory and so survives restarts): one gateway per data directory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::App;

/// Time between two sweeps.
pub const INTERVAL: Duration = Duration::from_secs(30);
/// How long past its deadline a tracked sandbox may still exist before it is destroyed anyway.
const GRACE: Duration = Duration::from_secs(30);
const ABANDONED: &str =
    "the gateway stopped tracking this execution (restart or crash); its sandbox was removed";

/// Executions this process is running: id -> deadline once its sandbox has started.
#[derive(Debug, Default)]
pub struct LiveSet {
    inner: Mutex<HashMap<String, Option<Instant>>>,
}

impl LiveSet {
    /// Tracks `id` until the returned guard is dropped.
    pub fn track(self: &Arc<Self>, id: &str) -> LiveGuard {
        self.lock().insert(id.to_owned(), None);
        LiveGuard {
            set: Arc::clone(self),
            id: id.to_owned(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Instant>>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn snapshot(&self) -> HashMap<String, Option<Instant>> {
        self.lock().clone()
    }
}

/// Keeps an execution in the live set while it exists.
#[derive(Debug)]
pub struct LiveGuard {
    set: Arc<LiveSet>,
    id: String,
}

impl LiveGuard {
    pub fn started(&self, timeout: Duration) {
        self.set
            .lock()
            .insert(self.id.clone(), Some(Instant::now() + timeout));
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.set.lock().remove(&self.id);
    }
}

/// Sweeps once at start, then every [`INTERVAL`] until shutdown.
pub async fn run(app: Arc<App>) {
    loop {
        let report = sweep(&app).await;
        if report.containers > 0 || report.records > 0 {
            tracing::warn!(
                containers = report.containers,
                records = report.records,
                "reaped"
            );
        }
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tokio::time::sleep(INTERVAL) => {}
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct SweepReport {
    pub containers: usize,
    pub records: u64,
}

pub async fn sweep(app: &App) -> SweepReport {
    let mut report = SweepReport::default();
    let live = app.live.snapshot();
    match app.runtime.list().await {
        Ok(sandboxes) => {
            for sandbox in sandboxes {
                if sandbox.instance.as_deref() != Some(app.instance.as_str()) {
                    continue;
                }
                let keep = match live.get(&sandbox.execution_id) {
                    Some(Some(deadline)) => Instant::now() < *deadline + GRACE,
                    Some(None) => true,
                    None => false,
                };
                if keep {
                    continue;
                }
                match app.runtime.destroy(&sandbox.container_id).await {
                    Ok(()) => report.containers += 1,
                    Err(err) => tracing::error!(
                        execution_id = %sandbox.execution_id,
                        error = %err,
                        "reaper could not remove a sandbox"
                    ),
                }
            }
        }
        Err(err) => tracing::warn!(error = %err, "reaper cannot list sandboxes"),
    }
    let live_ids: Vec<String> = live.into_keys().collect();
    match app
        .audit
        .close_abandoned(&app.instance, &live_ids, ABANDONED)
        .await
    {
        Ok(closed) => report.records = closed,
        Err(err) => tracing::warn!(error = %err, "reaper cannot close abandoned records"),
    }
    report
}
