//! sandgate's gateway: the HTTP API, the use cases, the audit store and the container runtime.
//!
//! It is the process that decides (through `policy-engine`), records (PostgreSQL, before
//! anything runs) and runs (gVisor containers through dockerd). It is not a policy language
//! (that is Rego in `policies/`), not a container runtime (that is runsc) and not a client
//! library. See ARCHITECTURE.md for the map.

pub mod api;
pub mod app;
pub mod audit;
pub mod cli;
pub mod client;
pub mod config;
pub mod credentials;
pub mod database;
pub mod e2b;
pub mod egress;
pub mod errors;
pub mod ids;
pub mod mcp;
pub mod metrics;
pub mod outputs;
pub mod outputs_live;
pub mod plain;
pub mod principal;
pub mod role;
pub mod runtime;
pub mod session_wire;
pub mod status;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use app::{App, PolicyHandle};
use audit::{AuditError, AuditStore};
use config::Config;
use database::{Database, DatabaseError};
use runtime::docker::DockerRuntime;
use runtime::SandboxRuntime;

/// Extra time, beyond the longest allowed execution, that shutdown waits for running sandboxes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        err: std::io::Error,
    },
    #[error("audit database")]
    Database(#[from] DatabaseError),
    #[error("audit store")]
    Audit(#[from] AuditError),
    #[error("HTTP server failed")]
    Http(#[source] std::io::Error),
    #[error("the local audit journal")]
    Journal(#[from] audit::journal::JournalError),
    #[error("TLS configuration")]
    Tls(#[from] tls::TlsError),
    #[error("egress set-up")]
    Egress(#[source] egress::EgressError),
    #[error("data directory {path}")]
    DataDir {
        path: std::path::PathBuf,
        #[source]
        err: std::io::Error,
    },
}

/// Runs the gateway on `config.listen` until `shutdown` is cancelled.
pub async fn serve(config: Config, shutdown: CancellationToken) -> Result<(), ServeError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|err| ServeError::Bind {
            addr: config.listen,
            err,
        })?;
    serve_on(listener, config, Arc::new(DockerRuntime::new()), shutdown).await
}

/// Runs the gateway on an already bound listener with the given runtime (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    config: Config,
    runtime: Arc<dyn SandboxRuntime>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let revisions = app::policy_revisions::RevisionStore::new(
        config.data_dir.join("policy-revisions"),
        config.policy_keep,
    );
    let policy = Arc::new(PolicyHandle::load_keeping(&config.policy_dir, revisions).await);
    let db = Database::open_for_server(&config).await?;
    let result = run(listener, config, policy, &db, runtime, shutdown).await;
    db.close().await;
    result
}

async fn run(
    listener: TcpListener,
    config: Config,
    policy: Arc<PolicyHandle>,
    db: &Database,
    runtime: Arc<dyn SandboxRuntime>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    // Completions and connection closes the database could not take (now or before a restart)
    // wait here, and are written back first.
    let journal = audit::journal::Journal::open(&config.data_dir.join("journal"))?;
    let metrics = metrics::Metrics::new(config.images.keys().map(String::as_str));
    let audit = AuditStore::with_metrics(db.pool.clone(), Arc::new(metrics))
        .with_journal(Arc::new(journal));
    let replayed = audit.replay_journal().await?;
    if replayed > 0 {
        tracing::warn!(
            records = replayed,
            "journal from an earlier outage written back"
        );
    }
    let active = policy.current();
    audit
        .record_policy_revision(active.state.revision(), active.state.files(), "startup")
        .await?;
    audit
        .record_policy_sources(active.state.revision(), active.state.sources())
        .await?;
    // The revision this replica starts with is the last activated (If-Match and proposal
    // approvals compare against it across replicas: `app::policy`).
    if active.state.error().is_none() {
        audit
            .record_startup_revision(active.state.revision())
            .await?;
    }
    app::policy::sweep_at_startup(&config.data_dir, &config.policy_dir);
    let grace = Duration::from_millis(config.ceilings.timeout_ms) + SHUTDOWN_GRACE;
    let instance = instance_id(&config.data_dir).map_err(|err| ServeError::DataDir {
        path: config.data_dir.clone(),
        err,
    })?;
    // Read before anything starts, so a bad certificate or a missing credential stops start-up
    // with its reason.
    let acceptor = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let trust = egress::EgressTrust::load(
        config.egress_ca_file.as_deref(),
        &config.credentials,
        |var| std::env::var(var).ok(),
    )
    .map_err(ServeError::Egress)?;
    let cursors = Arc::new(egress::SessionCursors::default());
    let egress = egress_proxy_for(
        &config,
        &policy,
        &audit,
        &listener,
        (trust, Arc::clone(&cursors)),
    );
    let app = Arc::new(App::new(
        config,
        policy,
        audit,
        runtime,
        shutdown.clone(),
        instance,
        (egress, cursors),
    ));
    app.tasks.spawn(audit::durable::replay_periodically(
        app.audit.clone(),
        shutdown.clone(),
    ));
    // Before the reaper's first sweep closes what the previous run left (DESIGN 15).
    app.adopt_paused_sessions().await;
    app.tasks.spawn(app::reaper::run(Arc::clone(&app)));
    app.tasks.spawn(app::replicas::run(Arc::clone(&app)));
    app.tasks.spawn(app::pool::refill(Arc::clone(&app)));
    app.tasks
        .spawn(app::refusals::summarise_periodically(Arc::clone(&app)));
    app.tasks
        .spawn(app::approvals::expire_periodically(Arc::clone(&app)));
    let addr = listener.local_addr().map_err(ServeError::Http)?;
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    tracing::info!(%addr, scheme, policy_revision = active.state.revision(), instance = %app.instance, "sandgate listening");

    app.tasks.spawn(reload_on_sighup(Arc::clone(&app)));
    let router = api::router(Arc::clone(&app));
    let served = match acceptor {
        Some(acceptor) => {
            tls::serve(listener, acceptor, router, shutdown.clone(), &app.tasks).await;
            Ok(())
        }
        // The peer address reaches the handlers (refusals are counted per source address).
        None => axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await
        .map_err(ServeError::Http),
    };

    tracing::info!("shutting down: waiting for running executions");
    app.tasks.close();
    if tokio::time::timeout(grace, app.tasks.wait()).await.is_err() {
        tracing::error!("executions still running after the shutdown grace period");
    }
    served
}

/// The egress proxy, denying the gateway's own addresses. Without it (no usable resolver
/// configuration) the gateway still runs, and denies every grant of network.
fn egress_proxy_for(
    config: &Config,
    policy: &Arc<PolicyHandle>,
    audit: &AuditStore,
    listener: &TcpListener,
    trust: (egress::EgressTrust, Arc<egress::SessionCursors>),
) -> Option<egress_proxy::EgressProxy> {
    let mut own = egress_proxy::local_interface_addresses().unwrap_or_default();
    if let Ok(addr) = listener.local_addr() {
        own.push(addr.ip());
    }
    match egress::proxy(
        Arc::clone(policy) as Arc<dyn egress::EgressBundle>,
        audit.clone(),
        &config.egress_hosts,
        own,
        trust,
    ) {
        Ok(proxy) => Some(proxy),
        Err(err) => {
            tracing::error!(error = %errors::error_chain(&err), "egress proxy unavailable; network grants will be denied");
            None
        }
    }
}

/// This gateway's stable identity, kept in `<data_dir>/instance`: containers and records carry
/// it, so that after a restart the reaper knows which ones it left behind.
fn instance_id(data_dir: &std::path::Path) -> std::io::Result<String> {
    let path = data_dir.join("instance");
    match std::fs::read_to_string(&path) {
        Ok(id) if id.trim().starts_with("gw_") => Ok(id.trim().to_owned()),
        Ok(_) | Err(_) => {
            std::fs::create_dir_all(data_dir)?;
            let id = ids::new("gw");
            std::fs::write(&path, format!("{id}\n"))?;
            Ok(id)
        }
    }
}

/// SIGHUP reloads the policy directory and the credentials' values, like `POST /v1/policy/reload`.
async fn reload_on_sighup(app: Arc<App>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler; reload over the API instead");
        return;
    };
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = hangups.recv() => {
                app.reload_credentials("sighup");
                match app.policy.reload(&app.audit, "sighup").await {
                    Ok(accepted) => app.announce_policy(&accepted.revision).await,
                    Err(err) => tracing::error!(error = %err, "policy reload on SIGHUP failed"),
                }
            }
        }
    }
}
