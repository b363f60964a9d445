//! What the E2B layer keeps in memory per sandbox on this gateway: the sandbox's `envVars`
//! (never stored: they may hold secrets), its end of life (also stored, for `GET`), the pids
//! handed out and the processes running. Lost with the gateway, as its sessions are.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use super::connect::ProcessConfig;
use crate::app::session_procs::ProcessControl;
use crate::audit::ApiKey;

/// Most processes running at once in one sandbox (a start past it: `resource_exhausted`).
pub const MAX_PROCESSES: usize = 8;

/// Most connections following one sandbox's processes at once (`process.Process/Connect`;
/// each `Start` has its own follower besides).
pub const MAX_FOLLOWERS: usize = 16;

/// The next pid handed out, by every sandbox of this gateway: a pid is one sandbox's only, so
/// another sandbox's pid is never found in this one (`not_found`), whichever it names. Small
/// pids are a sandbox's own (its init, its runner); E2B's processes never are.
static NEXT_PID: AtomicU32 = AtomicU32::new(1000);

/// The E2B sandboxes this gateway serves.
#[derive(Debug, Default)]
pub struct Live {
    sandboxes: Mutex<HashMap<String, Arc<LiveSandbox>>>,
}

/// One sandbox's in-memory state.
#[derive(Debug)]
pub struct LiveSandbox {
    /// The key that created it: its session's owner, who commands run as.
    pub key: ApiKey,
    pub envs: BTreeMap<String, String>,
    end_at: Mutex<DateTime<Utc>>,
    /// Woken when `end_at` changes, so the watcher (`control::watch`) sleeps anew.
    pub end_changed: tokio::sync::Notify,
    running: Mutex<BTreeMap<u32, Running>>,
    /// Connections following its processes now (at most [`MAX_FOLLOWERS`]).
    followers: Arc<AtomicUsize>,
    /// Its directory watchers (`super::watch`): they end when it is dropped (killed).
    pub watchers: super::watch::Watchers,
}

/// One of a sandbox's [`MAX_FOLLOWERS`]; given back when dropped.
#[derive(Debug)]
pub struct Follower(Arc<AtomicUsize>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A process started through `process.Process/Start` and not ended yet.
#[derive(Debug, Clone)]
pub struct Running {
    pub config: ProcessConfig,
    pub tag: Option<String>,
    /// The session execution it is; `None` until its record exists.
    pub execution_id: Option<String>,
    /// How to reach it (stdin, signals); `None` until it started.
    pub control: Option<Arc<ProcessControl>>,
    /// Runs on a terminal (`pty.create`): its output events are `pty` data.
    pub pty: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Live {
    pub fn insert(&self, id: &str, sandbox: LiveSandbox) -> Arc<LiveSandbox> {
        let sandbox = Arc::new(sandbox);
        lock(&self.sandboxes).insert(id.to_owned(), Arc::clone(&sandbox));
        sandbox
    }

    pub fn get(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        lock(&self.sandboxes).get(id).cloned()
    }

    pub fn remove(&self, id: &str) {
        lock(&self.sandboxes).remove(id);
    }
}

impl LiveSandbox {
    pub fn new(key: ApiKey, envs: BTreeMap<String, String>, end_at: DateTime<Utc>) -> LiveSandbox {
        LiveSandbox {
            key,
            envs,
            end_at: Mutex::new(end_at),
            end_changed: tokio::sync::Notify::new(),
            running: Mutex::new(BTreeMap::new()),
            followers: Arc::new(AtomicUsize::new(0)),
            watchers: super::watch::Watchers::default(),
        }
    }

    pub fn end_at(&self) -> DateTime<Utc> {
        *lock(&self.end_at)
    }

    pub fn set_end_at(&self, end_at: DateTime<Utc>) {
        *lock(&self.end_at) = end_at;
        self.end_changed.notify_waiters();
    }

    /// A pid for a new process, and its entry among the running ones; `None` when
    /// [`MAX_PROCESSES`] run already.
    pub fn start(&self, config: ProcessConfig, tag: Option<String>, pty: bool) -> Option<u32> {
        let mut running = lock(&self.running);
        if running.len() >= MAX_PROCESSES {
            return None;
        }
        let pid = NEXT_PID.fetch_add(1, Ordering::Relaxed);
        let entry = Running {
            config,
            tag,
            execution_id: None,
            control: None,
            pty,
        };
        running.insert(pid, entry);
        Some(pid)
    }

    pub fn started_as(&self, pid: u32, execution_id: &str, control: Arc<ProcessControl>) {
        if let Some(running) = lock(&self.running).get_mut(&pid) {
            running.execution_id = Some(execution_id.to_owned());
            running.control = Some(control);
        }
    }

    pub fn ended(&self, pid: u32) {
        lock(&self.running).remove(&pid);
    }

    pub fn running(&self) -> Vec<(u32, Running)> {
        lock(&self.running)
            .iter()
            .map(|(pid, running)| (*pid, running.clone()))
            .collect()
    }

    /// A place among the followers, unless all [`MAX_FOLLOWERS`] are taken.
    pub fn follower(&self) -> Option<Follower> {
        let taken = self
            .followers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now < MAX_FOLLOWERS).then_some(now + 1)
            });
        taken.ok().map(|_| Follower(Arc::clone(&self.followers)))
    }

    pub fn find(&self, pid: Option<u32>, tag: Option<&str>) -> Option<(u32, Running)> {
        self.running().into_iter().find(|(p, running)| {
            pid.is_some_and(|pid| pid == *p)
                || tag.is_some_and(|tag| running.tag.as_deref() == Some(tag))
        })
    }
}
