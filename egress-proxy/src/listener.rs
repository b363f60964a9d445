//! The proxy and its per-execution listeners: one Unix socket per execution, whose connections
//! all belong to that execution.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::addr::{AddressPolicy, GrantedRange};
use crate::config::{ExecutionGrant, ProxyConfig};
use crate::conn::{self, Admission};
use crate::denials::Denials;
use crate::execution::{Execution, Shared};
use crate::relay::Budget;
use crate::seams::{ConnectionRecorder, EgressPolicy, Resolve};

/// Mode of every egress socket: the sandbox connects as an unprivileged user (uid 65534) through
/// gVisor's host-uds; the directory the gateway creates for it is what limits who can reach it.
const SOCKET_MODE: u32 = 0o666;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Connections over the limit whose head is still read (to record what they asked for) before
/// they are refused; past these, further ones are refused without reading anything.
const OVERFLOW_SLOTS: usize = 16;

/// A listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("binding egress socket {path}")]
    Bind {
        path: String,
        #[source]
        err: std::io::Error,
    },
    #[error("setting mode {SOCKET_MODE:o} on egress socket {path}")]
    Permissions {
        path: String,
        #[source]
        err: std::io::Error,
    },
}

/// The filtering forward proxy. Cheap to clone; serves any number of executions, each on its
/// own socket.
#[derive(Clone)]
pub struct EgressProxy {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl EgressProxy {
    pub fn new(
        config: ProxyConfig,
        policy: Arc<dyn EgressPolicy>,
        resolver: Arc<dyn Resolve>,
        recorder: Arc<dyn ConnectionRecorder>,
    ) -> EgressProxy {
        EgressProxy {
            shared: Arc::new(Shared {
                config,
                policy,
                resolver,
                recorder,
            }),
        }
    }

    /// The settings every listener shares.
    pub fn config(&self) -> &ProxyConfig {
        &self.shared.config
    }

    /// Binds `socket_path` (which must not exist; mode 0666) and serves the execution's
    /// connections on it until the returned handle is closed or dropped, or `shutdown` fires.
    /// Must be called within a Tokio runtime.
    pub fn serve_execution(
        &self,
        socket_path: &Path,
        grant: ExecutionGrant,
        shutdown: CancellationToken,
    ) -> Result<ExecutionListener, ProxyError> {
        let path = || socket_path.display().to_string();
        let listener = UnixListener::bind(socket_path)
            .map_err(|err| ProxyError::Bind { path: path(), err })?;
        std::fs::set_permissions(socket_path, Permissions::from_mode(SOCKET_MODE))
            .map_err(|err| ProxyError::Permissions { path: path(), err })?;
        let execution = Arc::new(execution(grant, &self.shared.config));
        let cancel = shutdown.child_token();
        let tracker = TaskTracker::new();
        info!(
            execution_id = %execution.id,
            socket = %socket_path.display(),
            max_connections = execution.limits.max_connections,
            max_bytes = execution.limits.max_bytes,
            "egress listener started"
        );
        tracker.spawn(accept_loop(
            listener,
            self.shared.clone(),
            execution.clone(),
            cancel.clone(),
            tracker.clone(),
            socket_path.to_path_buf(),
        ));
        Ok(ExecutionListener {
            cancel,
            tracker,
            socket_path: socket_path.to_path_buf(),
            grace: self.shared.config.close_grace,
            execution,
            shared: self.shared.clone(),
        })
    }
}

fn execution(grant: ExecutionGrant, config: &ProxyConfig) -> Execution {
    let granted = grant
        .grant
        .allow
        .iter()
        .filter_map(|rule| GrantedRange::parse(&rule.host))
        .collect();
    Execution {
        addresses: AddressPolicy::new(config.denied_addresses.clone(), granted),
        budget: Budget::new(grant.limits.max_bytes),
        denials: Denials::new(&grant.limits),
        id: grant.execution_id,
        tenant: grant.tenant,
        grant: grant.grant,
        limits: grant.limits,
        inspection: grant.inspection,
    }
}

async fn accept_loop(
    listener: UnixListener,
    shared: Arc<Shared>,
    execution: Arc<Execution>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    socket_path: PathBuf,
) {
    let slots = Arc::new(Semaphore::new(execution.limits.max_connections as usize));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_SLOTS));
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let admission = match slots.clone().try_acquire_owned() {
                    Ok(slot) => Admission::Slot { _permit: slot },
                    Err(_) => match overflow.clone().try_acquire_owned() {
                        Ok(permit) => Admission::OverLimit { _permit: permit },
                        Err(_) => Admission::Flood,
                    },
                };
                tracker.spawn(conn::serve(
                    shared.clone(),
                    execution.clone(),
                    stream,
                    admission,
                    cancel.clone(),
                ));
            }
            Err(err) => {
                warn!(execution_id = %execution.id, error = %err, "accepting an egress connection failed");
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&socket_path);
}

/// A running listener for one execution. Dropping it stops accepting, cancels the execution's
/// connections (each still records its close) and removes the socket; [`ExecutionListener::close`]
/// does the same and waits for them.
pub struct ExecutionListener {
    cancel: CancellationToken,
    tracker: TaskTracker,
    socket_path: PathBuf,
    grace: Duration,
    execution: Arc<Execution>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ExecutionListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionListener")
            .field("execution_id", &self.execution.id)
            .field("socket_path", &self.socket_path)
            .finish_non_exhaustive()
    }
}

impl ExecutionListener {
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Bytes up plus down the execution has used so far, across its connections.
    pub fn bytes_used(&self) -> u64 {
        self.execution.budget.used()
    }

    /// Stops accepting, removes the socket, cancels every connection and waits up to the
    /// configured grace period for them to record their close, then records the last summary
    /// of denials counted without a row. Returns how many connections were still running when
    /// it gave up (0: all finished).
    pub async fn close(self) -> usize {
        self.drain().await;
        self.cancel.cancel();
        self.tracker.close();
        if tokio::time::timeout(self.grace, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                execution_id = %self.execution.id,
                running = self.tracker.len(),
                "egress connections still running after the close grace period"
            );
        }
        let execution = &self.execution;
        if let Some(summary) = execution
            .denials
            .take(&execution.id, &execution.tenant, true)
        {
            let record = self.shared.recorder.suppressed(&summary);
            if tokio::time::timeout(self.shared.config.record_timeout, record)
                .await
                .is_err()
            {
                warn!(execution_id = %execution.id, "recording the last denial summary timed out");
            }
        }
        self.tracker.len()
    }
}

impl ExecutionListener {
    /// Before cutting anything: connections whose program has closed its end are still
    /// relaying their last bytes and closes through sandbox-init's bridge, which may lag the
    /// program's exit; they get up to [`DRAIN`] to end on their own (and be recorded
    /// `egress.completed`). Only the accept loop left: nothing to wait for.
    async fn drain(&self) {
        let started = tokio::time::Instant::now();
        while self.tracker.len() > 1 && started.elapsed() < DRAIN {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// How long [`ExecutionListener::close`] lets open connections end on their own.
const DRAIN: Duration = Duration::from_millis(300);

impl Drop for ExecutionListener {
    fn drop(&mut self) {
        self.cancel.cancel();
        let _ = std::fs::remove_file(&self.socket_path);
    }
}
