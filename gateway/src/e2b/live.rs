//! What the E2B layer keeps in memory per sandbox on this gateway: the sandbox's `envVars`
//! (never stored: they may hold secrets), its end of life (also stored, for `GET`), the pids
//! handed out and the processes running. Lost with the gateway, as its sessions are.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use super::connect::ProcessConfig;
use crate::audit::ApiKey;

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
    next_pid: AtomicU32,
    running: Mutex<BTreeMap<u32, Running>>,
}

/// A process started through `process.Process/Start` and not ended yet.
#[derive(Debug, Clone)]
pub struct Running {
    pub config: ProcessConfig,
    pub tag: Option<String>,
    /// The session execution it is; `None` until its record exists.
    pub execution_id: Option<String>,
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
            // Small pids are the sandbox's own (init, the runner); E2B's processes never are.
            next_pid: AtomicU32::new(1000),
            running: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn end_at(&self) -> DateTime<Utc> {
        *lock(&self.end_at)
    }

    pub fn set_end_at(&self, end_at: DateTime<Utc>) {
        *lock(&self.end_at) = end_at;
        self.end_changed.notify_waiters();
    }

    /// A pid for a new process, and its entry among the running ones.
    pub fn start(&self, config: ProcessConfig, tag: Option<String>) -> u32 {
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        let running = Running {
            config,
            tag,
            execution_id: None,
        };
        lock(&self.running).insert(pid, running);
        pid
    }

    pub fn started_as(&self, pid: u32, execution_id: &str) {
        if let Some(running) = lock(&self.running).get_mut(&pid) {
            running.execution_id = Some(execution_id.to_owned());
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

    pub fn find(&self, pid: Option<u32>, tag: Option<&str>) -> Option<(u32, Running)> {
        self.running().into_iter().find(|(p, running)| {
            pid.is_some_and(|pid| pid == *p)
                || tag.is_some_and(|tag| running.tag.as_deref() == Some(tag))
        })
    }
}
