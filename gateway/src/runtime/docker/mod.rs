//! The Docker implementation of [`SandboxRuntime`], through bollard: the only module that
//! imports it. Every call has a timeout (`call.rs`); every container carries the instance
//! label and an owner label (`body.rs`) and is removed after its run, whatever happened
//! (`run.rs`, `cleanup.rs`).

mod body;
mod call;
mod checkpoint;
pub mod cleanup;
mod context;
mod oom;
mod procs;
mod run;
mod session_files;
mod turn;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::OnceCell;

use super::{
    RuntimeError, RuntimeHealth, Sandbox, SandboxInfo, SandboxPlan, SandboxRuntime, Waits,
};
use call::bounded;
pub use call::API_TIMEOUT;
use run::DockerSandbox;

/// How long a pooled sandbox may take to say it is ready (the Python runner imports the
/// preload under gVisor: seconds).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Default)]
pub struct DockerRuntime {
    client: OnceCell<Docker>,
    /// The daemon's Unix socket; `None`: `DOCKER_HOST`, else the system's default socket.
    socket: Option<PathBuf>,
}

impl DockerRuntime {
    pub fn new() -> DockerRuntime {
        DockerRuntime::default()
    }

    /// A runtime driving the daemon listening on `socket` (a test's private dockerd).
    pub fn at(socket: &Path) -> DockerRuntime {
        DockerRuntime {
            socket: Some(socket.to_owned()),
            ..DockerRuntime::default()
        }
    }

    /// The client, connected and version-negotiated on first use (dockerd 20.10 refuses the
    /// newer API version bollard asks for by default).
    async fn client(&self) -> Result<&Docker, RuntimeError> {
        self.client
            .get_or_try_init(|| async {
                let docker = match &self.socket {
                    Some(socket) => Docker::connect_with_unix(
                        &socket.to_string_lossy(),
                        API_TIMEOUT.as_secs(),
                        bollard::API_DEFAULT_VERSION,
                    ),
                    None => Docker::connect_with_local_defaults(),
                }
                .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
                let docker =
                    bounded("negotiate Docker API version", docker.negotiate_version()).await?;
                Ok(docker.with_timeout(API_TIMEOUT))
            })
            .await
    }

    /// Create, attach (before the start, so no output is lost), start, watch its memory
    /// cgroup for OOMs; a pooled sandbox is then waited for until its runner is ready. Whatever fails on the way removes it.
    async fn start_sandbox(&self, plan: SandboxPlan) -> Result<Box<dyn Sandbox>, RuntimeError> {
        if !plan.init_binary.is_file() {
            return Err(RuntimeError::MissingInit {
                path: plan.init_binary.clone(),
            });
        }
        let docker = self.client().await?.clone();
        let mut sandbox = DockerSandbox::create(docker, &plan).await?;
        let started = match sandbox.start().await {
            Ok(()) => {
                // Before any job: nothing in the sandbox can run out of memory yet.
                sandbox.watch_oom().await;
                match plan.waits {
                    Waits::Init | Waits::Session(_) => Ok(()),
                    Waits::Pool(_) => sandbox.ready(READY_TIMEOUT).await,
                }
            }
            Err(err) => Err(err),
        };
        match started {
            Ok(()) => Ok(Box::new(sandbox)),
            Err(err) => {
                Box::new(sandbox).discard().await;
                Err(err)
            }
        }
    }
}

impl SandboxRuntime for DockerRuntime {
    fn start(&self, plan: SandboxPlan) -> BoxFuture<'_, Result<Box<dyn Sandbox>, RuntimeError>> {
        self.start_sandbox(plan).boxed()
    }

    fn health<'a>(&'a self, runtimes: &'a [String]) -> BoxFuture<'a, RuntimeHealth> {
        async move {
            let mut health = RuntimeHealth {
                docker: Err("not checked".to_owned()),
                runtimes: runtimes.iter().map(|name| (name.clone(), false)).collect(),
            };
            let docker = match self.client().await {
                Ok(docker) => docker,
                Err(err) => {
                    health.docker = Err(err.to_string());
                    return health;
                }
            };
            match bounded("docker info", docker.info()).await {
                Ok(info) => {
                    health.docker = Ok(info.server_version.unwrap_or_default());
                    let registered = info.runtimes.unwrap_or_default();
                    for (name, present) in health.runtimes.iter_mut() {
                        *present = registered.contains_key(name);
                    }
                }
                Err(err) => health.docker = Err(err.to_string()),
            }
            health
        }
        .boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, RuntimeError>> {
        async move { cleanup::list(self.client().await?).await }.boxed()
    }

    fn destroy<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        async move { cleanup::remove(self.client().await?, container_id).await }.boxed()
    }

    fn start_process<'a>(
        &'a self,
        container: &'a str,
        spec: crate::runtime::procs::ProcessSpec,
    ) -> BoxFuture<'a, Result<crate::runtime::procs::StartedProcess, RuntimeError>> {
        async move { procs::start(self.client().await?, container, spec).await }.boxed()
    }

    fn process_exit<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, RuntimeError>> {
        async move { procs::exit(self.client().await?, handle).await }.boxed()
    }

    fn start_watcher<'a>(
        &'a self,
        container: &'a str,
        spec: crate::runtime::procs::WatchSpec,
    ) -> BoxFuture<'a, Result<crate::runtime::procs::StartedProcess, RuntimeError>> {
        async move { procs::start_watcher(self.client().await?, container, spec).await }.boxed()
    }

    fn signal_process<'a>(
        &'a self,
        container: &'a str,
        tag: &'a str,
        signal: crate::runtime::procs::ProcessSignal,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        async move { procs::signal(self.client().await?, container, tag, signal).await }.boxed()
    }

    fn restore<'a>(
        &'a self,
        plan: SandboxPlan,
        image: &'a Path,
    ) -> BoxFuture<'a, Result<Box<dyn Sandbox>, RuntimeError>> {
        async move {
            if !plan.init_binary.is_file() {
                return Err(RuntimeError::MissingInit {
                    path: plan.init_binary.clone(),
                });
            }
            let docker = self.client().await?.clone();
            let socket = checkpoint::daemon_socket(self.socket.as_deref());
            let sandbox = checkpoint::restore(docker, &socket, &plan, image).await?;
            Ok(Box::new(sandbox) as Box<dyn Sandbox>)
        }
        .boxed()
    }
}
