//! The gateway's side of the egress proxy: the proxy's three seams (policy, resolver, audit
//! recorder) implemented with the active policy bundle, the system resolver and Postgres, and
//! the per-execution set-up (a fresh socket directory, served, mounted, removed afterwards).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use egress_proxy::{
    Attempt, Closed, ConnectionId, ConnectionRecorder, DnsResolver, EgressPolicy, EgressProxy,
    ExecutionGrant, ExecutionLimits, ExecutionListener, ProxyConfig, RecordError, Resolve,
    ResolveError,
};
use policy_engine::{EgressDecision, EgressInput, NetworkGrant};

use crate::app::policy::PolicyHandle;
use crate::audit::egress::{ConnectionClose, ConnectionOpen};
use crate::audit::AuditStore;

pub use crate::runtime::{SANDBOX_PROXY_LISTEN, SANDBOX_SOCKET, SANDBOX_SOCKET_DIR};
const CLOSE_ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress socket directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("egress listener")]
    Listen(#[source] egress_proxy::ProxyError),
    #[error("egress resolver")]
    Resolver(#[source] egress_proxy::ResolverSetupError),
}

/// Builds the proxy the gateway serves every execution's socket with.
pub fn proxy(
    policy: Arc<PolicyHandle>,
    audit: AuditStore,
    static_hosts: &BTreeMap<String, Vec<IpAddr>>,
    own_addresses: Vec<IpAddr>,
) -> Result<EgressProxy, EgressError> {
    let config = ProxyConfig {
        denied_addresses: own_addresses,
        ..ProxyConfig::default()
    };
    let resolver = LayeredResolver {
        fixed: static_hosts.clone(),
        system: DnsResolver::system(config.dns_timeout).map_err(EgressError::Resolver)?,
    };
    Ok(EgressProxy::new(
        config,
        Arc::new(ActivePolicy(Arc::clone(&policy))),
        Arc::new(resolver),
        Arc::new(Recorder { audit, policy }),
    ))
}

/// One execution's egress: the listener on `egress.sock` in its sandbox's socket directory
/// (mounted at `/run/sandgate`, see `app::home`).
#[derive(Debug)]
pub struct ExecutionEgress {
    socket: PathBuf,
    listener: Option<ExecutionListener>,
}

impl ExecutionEgress {
    /// Serves `<dir>/egress.sock` with `grant`, for exactly this execution.
    pub fn start(
        proxy: &EgressProxy,
        dir: &Path,
        execution_id: &str,
        tenant: &str,
        grant: &NetworkGrant,
        shutdown: CancellationToken,
    ) -> Result<ExecutionEgress, EgressError> {
        let grant = ExecutionGrant {
            execution_id: execution_id.to_owned(),
            tenant: tenant.to_owned(),
            grant: grant.clone(),
            limits: ExecutionLimits::from_grant(grant),
        };
        let socket = dir.join("egress.sock");
        let listener = proxy
            .serve_execution(&socket, grant, shutdown)
            .map_err(EgressError::Listen)?;
        Ok(ExecutionEgress {
            socket,
            listener: Some(listener),
        })
    }

    /// Stops the listener (its connections record their close) and removes the socket.
    pub async fn finish(mut self) {
        if let Some(listener) = self.listener.take() {
            listener.close().await;
        }
        if let Err(err) = std::fs::remove_file(&self.socket) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(socket = %self.socket.display(), error = %err, "removing the egress socket failed");
            }
        }
    }
}

/// The directory holding every execution's socket directory: created mode 0700, and made 0700
/// again if something widened it, so no host user but its owner (the gateway's, root) can
/// traverse it to a socket. A symlink in its place is refused.
pub fn private_root(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
    {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err),
    }
    let meta = std::fs::symlink_metadata(root)?;
    if !meta.file_type().is_dir() {
        return Err(std::io::Error::other(
            "the egress socket root is not a directory (a symlink?)",
        ));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The sandbox environment that sends standard tools through the bridge.
pub fn proxy_env() -> impl Iterator<Item = (&'static str, String)> {
    let url = format!("http://{SANDBOX_PROXY_LISTEN}");
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .into_iter()
    .map(move |name| (name, url.clone()))
    .chain([("NO_PROXY", String::new()), ("no_proxy", String::new())])
}

/// Decides with whatever bundle is active when the connection arrives.
struct ActivePolicy(Arc<PolicyHandle>);

impl EgressPolicy for ActivePolicy {
    fn decide(&self, input: &EgressInput) -> EgressDecision {
        self.0.current().state.decide_egress(input)
    }
}

/// Names configured in `egress_hosts` first (tests, split-horizon set-ups), then the system.
struct LayeredResolver {
    fixed: BTreeMap<String, Vec<IpAddr>>,
    system: DnsResolver,
}

impl Resolve for LayeredResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveError>> {
        match self.fixed.get(name) {
            Some(addresses) => {
                let addresses = addresses.clone();
                async move { Ok(addresses) }.boxed()
            }
            None => self.system.resolve(name),
        }
    }
}

/// Records attempts in `egress_connections` and the audit chain.
struct Recorder {
    audit: AuditStore,
    policy: Arc<PolicyHandle>,
}

impl ConnectionRecorder for Recorder {
    fn open<'a>(
        &'a self,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<ConnectionId, RecordError>> {
        async move {
            let open = ConnectionOpen {
                execution_id: attempt.execution_id.clone(),
                tenant: attempt.tenant.clone(),
                host: attempt.host.clone(),
                port: i32::from(attempt.port),
                scheme: attempt.scheme.map_or("invalid", |s| s.as_str()).to_owned(),
                sni: attempt.sni.clone(),
                method: attempt.method.clone(),
                path: attempt.path.clone(),
                resolved_addr: attempt.address.map(|a| a.to_string()),
                allow: attempt.allow,
                reason: attempt.reason.to_string(),
                message: attempt.message.clone(),
                policy_reasons: serde_json::json!(attempt.policy_reasons),
                policy_revision: self.policy.current().state.revision().to_owned(),
                opened_at: attempt
                    .started_at
                    .duration_since(UNIX_EPOCH)
                    .ok()
                    .and_then(|d| chrono::DateTime::from_timestamp_micros(d.as_micros() as i64))
                    .unwrap_or_else(crate::ids::now_micros),
            };
            self.audit
                .open_connection(&open)
                .await
                .map(ConnectionId)
                .map_err(|err| RecordError(crate::app::error_chain(&err)))
        }
        .boxed()
    }

    fn close<'a>(&'a self, id: ConnectionId, closed: &'a Closed) -> BoxFuture<'a, ()> {
        async move {
            let close = ConnectionClose {
                bytes_up: i64::try_from(closed.bytes_up).unwrap_or(i64::MAX),
                bytes_down: i64::try_from(closed.bytes_down).unwrap_or(i64::MAX),
                duration_ms: i64::try_from(closed.duration.as_millis()).unwrap_or(i64::MAX),
                close_reason: closed.reason.to_string(),
                error: closed.error.clone(),
            };
            for attempt in 1..=CLOSE_ATTEMPTS {
                match self.audit.close_connection(&id.0, &close).await {
                    Ok(()) => return,
                    Err(err) => {
                        tracing::warn!(connection = %id.0, attempt, error = %err, "recording a connection close failed");
                        tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                    }
                }
            }
        }
        .boxed()
    }
}
