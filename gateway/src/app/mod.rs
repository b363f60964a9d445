//! Use cases: what the gateway does, independent of HTTP. Handlers call these; these call the
//! policy engine, the audit store and the runtime, in that order.

pub mod approvals;
mod approved;
pub mod contexts;
pub mod executions;
pub mod floor;
mod forks;
pub mod home;
pub mod keys;
pub mod launch;
pub mod listing;
pub mod overflow;
pub mod payloads;
mod pipeline;
pub mod policy;
mod policy_dir;
mod policy_follow;
pub mod policy_revisions;
pub mod policy_upload;
pub mod pool;
pub mod pool_key;
mod pool_refill;
mod pool_restore;
pub mod pool_sizing;
mod proposal_candidate;
pub mod proposals;
mod purged_outputs;
pub mod reaper;
pub mod refusals;
pub mod replay;
pub mod replicas;
pub mod request;
pub mod scheduler;
pub mod session_files;
mod session_owner;
pub mod session_procs;
mod session_relay;
pub mod session_results;
mod session_runs;
pub mod session_watch;
pub mod sessions;
mod snapshot_replicas;
mod snapshot_restart;
pub mod snapshots;
pub mod stream;
mod subjects;
pub mod validate;

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::{AuditError, AuditStore};
use crate::config::Config;
use crate::errors::error_chain;
use crate::runtime::SandboxRuntime;
pub use policy::{PolicyHandle, PolicyState};

/// Shared state of one gateway process.
pub struct App {
    pub config: Config,
    pub policy: Arc<PolicyHandle>,
    pub audit: AuditStore,
    pub runtime: Arc<dyn SandboxRuntime>,
    /// Running-sandbox slots (`max_concurrent`), per-tenant fair queues (`max_queued`).
    pub scheduler: Arc<scheduler::Scheduler>,
    /// Every execution runs in a task here, so a dropped HTTP request cannot abandon a sandbox.
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
    /// Names this gateway (stable across restarts) on the containers and rows it creates.
    pub instance: String,
    /// The egress proxy; `None` if it could not be set up (then no grant of network is run).
    pub egress: Option<egress_proxy::EgressProxy>,
    /// The execution running in each session with a grant, for its connections' rows.
    pub session_cursors: Arc<crate::egress::SessionCursors>,
    /// Where per-execution egress socket directories are created.
    pub egress_root: PathBuf,
    /// Executions in flight in this process, for the reaper.
    pub live: Arc<reaper::LiveSet>,
    pub init_binary: PathBuf,
    /// Live output of running executions (`/events`).
    pub streams: stream::Streams,
    /// Per-execution `/output` tmpfs mounts.
    pub scratch_root: PathBuf,
    /// Collected output files, `<outputs_root>/<execution id>/<path>`.
    pub outputs_root: PathBuf,
    /// Sandboxes started ahead (`warm_pool`); empty when off.
    pub pool: Arc<pool::WarmPool>,
    /// Refusals anyone can cause in bulk, counted per window (bounded audit, 429 past the rate).
    pub refusals: refusals::Refusals,
    /// The open sessions this gateway holds.
    pub sessions: sessions::Sessions,
    /// This replica's side of the coordination with the others on the database.
    pub replicas: replicas::Replicas,
    /// Proposal builds running here, bounded (`proposals.concurrent_builds`).
    pub proposal_builds: proposals::Builds,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("instance", &self.instance)
            .field("policy_dir", &self.policy.dir())
            .finish_non_exhaustive()
    }
}

impl App {
    pub fn new(
        config: Config,
        policy: Arc<PolicyHandle>,
        audit: AuditStore,
        runtime: Arc<dyn SandboxRuntime>,
        shutdown: CancellationToken,
        instance: String,
        (egress, session_cursors): (
            Option<egress_proxy::EgressProxy>,
            Arc<crate::egress::SessionCursors>,
        ),
    ) -> App {
        let under_data = |name: &str| {
            let path = config.data_dir.join(name);
            std::path::absolute(&path).unwrap_or(path)
        };
        let pool = pool::WarmPool::new(
            pool_sizing(&config),
            config.python_preload.clone(),
            pool_restore::templates_dir(&config, &instance).inspect(|dir| pool_restore::sweep(dir)),
            config.snapshots.restore_even_if_slower,
        );
        App {
            pool,
            egress,
            session_cursors,
            egress_root: under_data("egress"),
            scratch_root: under_data("scratch"),
            outputs_root: under_data("outputs"),
            streams: stream::Streams::default(),
            refusals: refusals::Refusals::new(config.refusals),
            sessions: sessions::Sessions::default(),
            replicas: replicas::Replicas::default(),
            proposal_builds: proposals::Builds::new(config.proposals.concurrent_builds),
            scheduler: scheduler::Scheduler::new(
                config.max_concurrent,
                config.max_queued,
                config.max_queued_per_tenant,
            ),
            init_binary: config.sandbox_init_path(),
            instance,
            live: Arc::default(),
            policy,
            audit,
            runtime,
            tasks: TaskTracker::new(),
            shutdown,
            config,
        }
    }

    /// Reads the credentials' values again (a reload: SIGHUP or `POST /v1/policy/reload`);
    /// executions started from now on use them. On an error (which names the credential, never
    /// a value) the previous values stay. `None`: no egress proxy, nothing to reload.
    pub fn reload_credentials(
        &self,
        loaded_by: &str,
    ) -> Option<Result<usize, crate::credentials::CredentialError>> {
        let proxy = self.egress.as_ref()?;
        let reloaded = crate::credentials::reload(proxy, &self.config.credentials, |var| {
            std::env::var(var).ok()
        });
        match &reloaded {
            Ok(count) => tracing::info!(
                loaded_by,
                credentials = count,
                "credential values read again"
            ),
            Err(err) => {
                tracing::error!(loaded_by, error = %error_chain(err), "credential values not read again; the previous values stay")
            }
        }
        Some(reloaded)
    }
}

/// How the warm pool sizes itself: `warm_pool: {}` is no pool; otherwise every language with
/// an image is pooled on demand, and `warm_pool`'s counts are the floors of the configured
/// default shape (its image, the first configured backend's runtime, `gvisor` if configured,
/// `warm_pool_limits` under the ceilings).
fn pool_sizing(config: &Config) -> pool::Sizing {
    let languages = if config.warm_pool.is_empty() {
        std::collections::BTreeSet::new()
    } else {
        config.images.keys().cloned().collect()
    };
    let floors = config
        .warm_pool
        .iter()
        .filter(|(_, count)| **count > 0)
        .filter_map(|(language, count)| {
            let shape = seed_shape(config, language)?;
            let key = pool::PoolKey::of_shape(language, pool::Serves::Execution, &shape);
            Some((key, *count))
        })
        .collect();
    pool::Sizing {
        floors,
        window: std::time::Duration::from_secs(config.warm_pool_window_s),
        budget_mb: config.warm_pool_memory_mb,
        languages,
    }
}

/// The configured default shape of a language.
fn seed_shape(config: &Config, language: &str) -> Option<pool::Shape> {
    let image = config.images.get(language)?.clone();
    let backend = config
        .backends
        .get("gvisor")
        .or_else(|| config.backends.values().next())?;
    let w = &config.warm_pool_limits;
    Some(pool::Shape {
        image,
        runtime: backend.runtime.clone(),
        limits: policy_engine::Limits {
            timeout_ms: 0,
            output_bytes: 0,
            memory_mb: w.memory_mb.min(config.ceilings.memory_mb),
            cpus: pool::nano_rounded(w.cpus.min(config.ceilings.cpus)),
            pids: w.pids.min(config.ceilings.pids).max(floor::MIN_PIDS),
            disk_mb: w.disk_mb.min(config.ceilings.disk_mb),
        },
    })
}

/// Errors of the use cases, mapped to HTTP by `api::error`.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Invalid(String),
    #[error("not found")]
    NotFound,
    /// Authenticated, but not allowed to do this (e.g. approve its own request).
    #[error("{0}")]
    Forbidden(String),
    /// Not found, with a message that may be shown (the caller may see the execution).
    #[error("{0}")]
    NotFoundWhy(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    RateLimited(String),
    /// A policy change built on a revision that is no longer the active one.
    #[error("{0}")]
    RevisionConflict(String),
    /// The bundle suggests nothing for that decision.
    #[error("{0}")]
    NoSuggestion(String),
    #[error("the audit store is unavailable")]
    Unavailable(#[from] AuditError),
    /// Another replica that must act did not (in time): 503 with this message.
    #[error("{0}")]
    ReplicaUnavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}
