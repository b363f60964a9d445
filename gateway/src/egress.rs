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
    Attempt, Closed, ConnectionId, ConnectionRecorder, Credential, CredentialSet, DnsResolver,
    EgressPolicy, EgressProxy, ExecutionGrant, ExecutionLimits, ExecutionListener,
    InspectedRequest, Inspection, ProxyConfig, RecordError, RequestDone, RequestId, Resolve,
    ResolveError, Suppressed,
};
use policy_engine::{EgressDecision, EgressInput, NetworkGrant};

use crate::audit::egress::{
    ConnectionClose, ConnectionOpen, EgressOwner, RequestClose, RequestOpen,
};
use crate::audit::events::{self, egress as egress_events};
use crate::audit::AuditStore;
use crate::config::CredentialConfig;

pub use crate::runtime::{SANDBOX_PROXY_LISTEN, SANDBOX_SOCKET, SANDBOX_SOCKET_DIR};
const CLOSE_ATTEMPTS: u32 = 5;
/// Inside the sandbox: the trust bundle of an execution with inspected destinations (system
/// roots + the execution's CA), written by sandbox-init from the job's files.
pub const SANDBOX_CA_BUNDLE: &str = "/tmp/sandgate/ca-bundle.pem";
/// The variables common TLS clients read their trust from; each names [`SANDBOX_CA_BUNDLE`].
pub const CA_BUNDLE_ENV: [&str; 6] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];
/// The active policy bundle as the proxy's seams use it: decide a connection, name the revision
/// that decided. `app::PolicyHandle` implements it; a trait here keeps egress below the use
/// cases that start it.
pub trait EgressBundle: Send + Sync {
    /// The active bundle's `sandgate.egress` decision.
    fn decide_egress(&self, input: &EgressInput) -> EgressDecision;
    /// The active bundle's revision, recorded with each attempt.
    fn revision(&self) -> String;
}

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
    #[error("egress credentials")]
    Credentials(#[source] crate::credentials::CredentialError),
    #[error("upstream TLS trust (egress_ca_file)")]
    UpstreamTls(#[source] egress_proxy::TlsSetupError),
    #[error("inspection for the execution")]
    Inspection(#[source] egress_proxy::InspectionError),
}

/// What the proxy needs to inspect: the upstream trust and the credentials' values. Loaded at
/// start-up (a missing variable or file is an error naming the credential, never the value);
/// the values are read again on reload (`crate::credentials::reload`).
#[derive(Debug)]
pub struct EgressTrust {
    pub upstream_tls: Arc<rustls::ClientConfig>,
    pub credentials: BTreeMap<String, Credential>,
}

impl EgressTrust {
    pub fn load(
        egress_ca_file: Option<&Path>,
        configured: &BTreeMap<String, CredentialConfig>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<EgressTrust, EgressError> {
        let upstream_tls =
            egress_proxy::upstream_tls(egress_ca_file).map_err(EgressError::UpstreamTls)?;
        let credentials =
            crate::credentials::load(configured, env).map_err(EgressError::Credentials)?;
        Ok(EgressTrust {
            upstream_tls,
            credentials,
        })
    }
}

/// Which execution of a session is running, for the session's connections: a session's grant
/// is served on one socket for its whole life (its listener is named by the session id), and
/// each connection row names the session and the execution running when it opened (none
/// between executions, e.g. a background thread's).
#[derive(Debug, Default)]
pub struct SessionCursors {
    running: std::sync::Mutex<BTreeMap<String, Option<String>>>,
}

impl SessionCursors {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<String>>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A session's listener starts: its connections are the session's from now on.
    pub fn open(&self, session_id: &str) {
        self.lock().insert(session_id.to_owned(), None);
    }

    /// `execution_id` runs in the session now (`None`: it ended).
    pub fn running(&self, session_id: &str, execution_id: Option<&str>) {
        if let Some(slot) = self.lock().get_mut(session_id) {
            *slot = execution_id.map(str::to_owned);
        }
    }

    pub fn close(&self, session_id: &str) {
        self.lock().remove(session_id);
    }

    /// Whose a connection on the listener named `listener` is.
    pub fn owner(&self, listener: &str) -> EgressOwner {
        match self.lock().get(listener) {
            Some(running) => EgressOwner {
                execution_id: running.clone(),
                session_id: Some(listener.to_owned()),
            },
            None => EgressOwner {
                execution_id: Some(listener.to_owned()),
                session_id: None,
            },
        }
    }
}

/// An execution running in a session, for its connections' rows: named at the start, and no
/// longer once this is dropped, however the turn ended.
#[derive(Debug)]
pub struct Running<'a> {
    cursors: &'a SessionCursors,
    session_id: &'a str,
}

impl<'a> Running<'a> {
    pub fn start(
        cursors: &'a SessionCursors,
        session_id: &'a str,
        execution_id: &str,
    ) -> Running<'a> {
        cursors.running(session_id, Some(execution_id));
        Running {
            cursors,
            session_id,
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.cursors.running(self.session_id, None);
    }
}

/// Builds the proxy the gateway serves every execution's socket with.
pub fn proxy(
    policy: Arc<dyn EgressBundle>,
    audit: AuditStore,
    static_hosts: &BTreeMap<String, Vec<IpAddr>>,
    own_addresses: Vec<IpAddr>,
    (trust, cursors): (EgressTrust, Arc<SessionCursors>),
) -> Result<EgressProxy, EgressError> {
    let config = ProxyConfig {
        denied_addresses: own_addresses,
        upstream_tls: Some(trust.upstream_tls),
        credentials: CredentialSet::new(trust.credentials),
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
        Arc::new(Recorder {
            audit,
            policy,
            cursors,
        }),
    ))
}

/// Where and for whom an execution's listener serves.
#[derive(Debug, Clone, Copy)]
pub struct Listen<'a> {
    pub dir: &'a Path,
    pub execution_id: &'a str,
    pub tenant: &'a str,
    pub grant: Option<&'a NetworkGrant>,
}

/// One execution's egress: the listener on `egress.sock` in its sandbox's socket directory
/// (mounted at `/run/sandgate`, see `app::home`).
#[derive(Debug)]
pub struct ExecutionEgress {
    socket: PathBuf,
    listener: Option<ExecutionListener>,
    /// The CA and placeholders served (with an inspected destination): a checkpoint of the
    /// sandbox carries them into its restores (`app::snapshots`).
    inspection: Option<Arc<Inspection>>,
    /// What the sandbox must get for inspected destinations (empty without any).
    pub sandbox: SandboxTrust,
}

/// Environment and files an execution's sandbox gets for its inspected destinations: the trust
/// bundle (system roots + the execution's CA; never a key) at [`SANDBOX_CA_BUNDLE`], the
/// variables naming it, and `SANDGATE_CREDENTIAL_<NAME>=sgph_…` placeholders. Never a
/// credential's value.
#[derive(Debug, Default)]
pub struct SandboxTrust {
    pub env: Vec<(String, String)>,
    pub files: Vec<SandboxFile>,
}

/// A file the sandbox gets (written by sandbox-init from the job's `files`).
#[derive(Debug)]
pub struct SandboxFile {
    pub path: String,
    pub contents: Vec<u8>,
    pub mode: u32,
}

impl SandboxTrust {
    fn for_inspection(inspection: &Inspection) -> SandboxTrust {
        let mut env: Vec<(String, String)> = CA_BUNDLE_ENV
            .iter()
            .map(|name| ((*name).to_owned(), SANDBOX_CA_BUNDLE.to_owned()))
            .collect();
        env.extend(inspection.credentials.env());
        let bundle = egress_proxy::trust_bundle(&inspection.ca);
        SandboxTrust {
            env,
            files: vec![SandboxFile {
                path: SANDBOX_CA_BUNDLE.to_owned(),
                contents: bundle.into_bytes(),
                mode: 0o444,
            }],
        }
    }
}

impl ExecutionEgress {
    /// Serves `<dir>/egress.sock` with `grant`, for exactly this execution. Without a grant
    /// (`None`) the socket is served all the same, with nothing allowed: every attempt is
    /// refused with `egress.no_grant`, which names how to ask for the destination, rather than
    /// the program seeing a name that does not resolve (issue 21 item 11). The floor holds
    /// either way: the sandbox has no network interface, only this socket.
    pub fn start(
        proxy: &EgressProxy,
        dir: &Path,
        execution_id: &str,
        tenant: &str,
        grant: Option<&NetworkGrant>,
        shutdown: CancellationToken,
    ) -> Result<ExecutionEgress, EgressError> {
        let listen = Listen {
            dir,
            execution_id,
            tenant,
            grant,
        };
        ExecutionEgress::start_carrying(proxy, &listen, None, shutdown)
    }

    /// As [`ExecutionEgress::start`] for a sandbox restored from a checkpoint of one that was
    /// served `carried`: the restored program trusts that CA and holds those placeholders, so
    /// the new grant is served with them ([`Inspection::for_grant_carrying`]).
    pub fn start_carrying(
        proxy: &EgressProxy,
        listen: &Listen<'_>,
        carried: Option<&Inspection>,
        shutdown: CancellationToken,
    ) -> Result<ExecutionEgress, EgressError> {
        let Listen {
            dir,
            execution_id,
            tenant,
            grant,
        } = *listen;
        let grant = match grant {
            Some(grant) => granted(proxy, execution_id, tenant, grant, carried)?,
            None => ExecutionGrant::none(execution_id, tenant),
        };
        let inspection = grant.inspection.clone();
        let sandbox = grant
            .inspection
            .as_deref()
            .map(SandboxTrust::for_inspection)
            .unwrap_or_default();
        let socket = dir.join("egress.sock");
        // The sandbox's home made this directory; a runtime without a host mount (the fake one
        // of the orchestration tests) may not have kept it, and every execution now gets a
        // listener, granted or not.
        std::fs::create_dir_all(dir).map_err(|err| EgressError::Dir {
            path: dir.to_owned(),
            err,
        })?;
        let listener = proxy
            .serve_execution(&socket, grant, shutdown)
            .map_err(EgressError::Listen)?;
        Ok(ExecutionEgress {
            socket,
            listener: Some(listener),
            inspection,
            sandbox,
        })
    }

    /// The CA and placeholders this listener serves, if it inspects anything.
    pub fn inspection(&self) -> Option<Arc<Inspection>> {
        self.inspection.clone()
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

/// What the listener of an execution with a grant serves: the grant, its limits, and for
/// inspected destinations a fresh CA and the credentials' placeholders.
fn granted(
    proxy: &EgressProxy,
    execution_id: &str,
    tenant: &str,
    grant: &NetworkGrant,
    carried: Option<&Inspection>,
) -> Result<ExecutionGrant, EgressError> {
    let inspection = Inspection::for_grant_carrying(execution_id, grant, proxy.config(), carried)
        .map_err(EgressError::Inspection)?
        .map(Arc::new);
    Ok(ExecutionGrant {
        execution_id: execution_id.to_owned(),
        tenant: tenant.to_owned(),
        grant: grant.clone(),
        limits: ExecutionLimits::from_grant(grant),
        inspection,
    })
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
struct ActivePolicy(Arc<dyn EgressBundle>);

impl EgressPolicy for ActivePolicy {
    fn decide(&self, input: &EgressInput) -> EgressDecision {
        self.0.decide_egress(input)
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
    policy: Arc<dyn EgressBundle>,
    cursors: Arc<SessionCursors>,
}

impl ConnectionRecorder for Recorder {
    fn open<'a>(
        &'a self,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<ConnectionId, RecordError>> {
        async move {
            let open = ConnectionOpen {
                owner: self.cursors.owner(&attempt.execution_id),
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
                policy_revision: self.policy.revision(),
                opened_at: attempt
                    .started_at
                    .duration_since(UNIX_EPOCH)
                    .ok()
                    .and_then(|d| chrono::DateTime::from_timestamp_micros(d.as_micros() as i64))
                    .unwrap_or_else(crate::ids::now_micros),
            };
            // What the journal holds (closes, completions from the last outage) goes first, so
            // nothing newer is recorded ahead of it; until it has, attempts fail closed.
            if !self.audit.journal_drained().await {
                return Err(RecordError(
                    "the audit journal has not been written back to the database yet".to_owned(),
                ));
            }
            self.audit
                .open_connection(&open)
                .await
                .map(ConnectionId)
                .map_err(|err| RecordError(crate::errors::error_chain(&err)))
        }
        .boxed()
    }

    /// One `egress.denied.repeated` event: the denials of one window that had no row.
    fn suppressed<'a>(&'a self, summary: &'a Suppressed) -> BoxFuture<'a, ()> {
        async move {
            let time = |at: std::time::SystemTime| {
                let micros = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
                chrono::DateTime::from_timestamp_micros(i64::try_from(micros).unwrap_or(0))
            };
            let owner = self.cursors.owner(&summary.execution_id);
            let event = crate::audit::NewEvent {
                kind: api_types::EventKind::EgressDeniedRepeated,
                execution_id: owner.execution_id.clone(),
                key_id: None,
                tenant: Some(summary.tenant.clone()),
                decision_id: None,
                allow: Some(false),
                reasons: events::reason(
                    "egress.too_many_denials",
                    "denied attempts past the execution's bounds, counted",
                ),
                input: events::column(&egress_events::DeniedWindow {
                    from: time(summary.from),
                    until: time(summary.until),
                    session_id: owner.session_id.clone(),
                }),
                decision: events::column(&egress_events::DeniedCount {
                    allow: false,
                    count: summary.count,
                    by_reason: summary.by_reason.iter().cloned().collect::<BTreeMap<_, _>>(),
                }),
                policy_revision: Some(self.policy.revision()),
            };
            if let Err(err) = self.audit.record_event(&event).await {
                tracing::error!(execution_id = %summary.execution_id, count = summary.count, error = %crate::errors::error_chain(&err), "a denial summary was not recorded");
            }
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
                closed_at: crate::ids::now_micros(),
            };
            // To the database, or else to the local journal (replayed when it returns).
            if let Err(err) = self.audit.close_connection_durably(&id.0, &close).await {
                tracing::error!(connection = %id.0, error = %crate::errors::error_chain(&err), "a connection close was lost");
            }
            if closed.reason == egress_proxy::ReasonCode::CredentialMisdirected {
                if let Err(err) = self.audit.record_misdirected(&id.0).await {
                    tracing::error!(connection = %id.0, error = %crate::errors::error_chain(&err), "a misdirected placeholder was not recorded as an event");
                }
            }
        }
        .boxed()
    }

    fn open_request<'a>(
        &'a self,
        request: &'a InspectedRequest,
    ) -> BoxFuture<'a, Result<RequestId, RecordError>> {
        async move {
            let open = RequestOpen {
                connection_id: request.connection.0.clone(),
                owner: self.cursors.owner(&request.execution_id),
                tenant: request.tenant.clone(),
                host: request.host.clone(),
                port: i32::from(request.port),
                method: request.method.clone(),
                path: request.path.clone(),
                query_sha256: request.query_sha256.clone(),
                header_names: request.header_names.clone(),
                credentials: request.credentials.clone(),
                upgrade: request.upgrade.clone(),
                allow: request.allow,
                reason: request.reason.to_string(),
                message: request.message.clone(),
                policy_reasons: serde_json::json!(request.policy_reasons),
                policy_revision: self.policy.revision(),
                started_at: timestamp(request.started_at),
            };
            self.audit
                .open_request(&open)
                .await
                .map(RequestId)
                .map_err(|err| RecordError(crate::errors::error_chain(&err)))
        }
        .boxed()
    }

    fn close_request<'a>(&'a self, id: RequestId, done: &'a RequestDone) -> BoxFuture<'a, ()> {
        async move {
            let close = RequestClose {
                status_code: i32::from(done.status),
                bytes_up: i64::try_from(done.bytes_up).unwrap_or(i64::MAX),
                bytes_down: i64::try_from(done.bytes_down).unwrap_or(i64::MAX),
                duration_ms: i64::try_from(done.duration.as_millis()).unwrap_or(i64::MAX),
                error: done.error.clone(),
            };
            for attempt in 1..=CLOSE_ATTEMPTS {
                match self.audit.close_request(&id.0, &close).await {
                    Ok(()) => return,
                    Err(err) => {
                        tracing::warn!(request = %id.0, attempt, error = %err, "recording a request's end failed");
                        tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                    }
                }
            }
        }
        .boxed()
    }
}

fn timestamp(at: std::time::SystemTime) -> chrono::DateTime<chrono::Utc> {
    at.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| chrono::DateTime::from_timestamp_micros(d.as_micros() as i64))
        .unwrap_or_else(crate::ids::now_micros)
}
