//! The Docker implementation of [`SandboxRuntime`], through bollard. Every call has a timeout;
//! every container carries the execution label and is removed afterwards, whatever happened.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, ResourcesUlimits,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, KillContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;

use super::{
    cleanup, CappedOutput, Channel, ExitTrailer, RunOutcome, RuntimeError, RuntimeHealth,
    SandboxInfo, SandboxRuntime, SandboxSpec, EXECUTION_LABEL, INIT_PATH, INSTANCE_LABEL,
};

/// Bound on every Docker API call that is not waiting for the program itself.
const API_TIMEOUT: Duration = Duration::from_secs(30);
/// After the program's deadline: how long to wait for the killed container to report its end.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// How long (steps of [`OOM_EVENT_POLL`]) to wait for dockerd's OOM flag after a SIGKILL end.
const OOM_EVENT_POLLS: u32 = 20;
const OOM_EVENT_POLL: Duration = Duration::from_millis(100);
const MIB: i64 = 1024 * 1024;
/// Open files per sandbox process.
const NOFILE: i64 = 1024;
const SANDBOX_USER: &str = "65534:65534";
/// Where the output area is mounted inside the sandbox.
pub const OUTPUT_PATH: &str = "/output";

#[derive(Debug, Default)]
pub struct DockerRuntime {
    client: OnceCell<Docker>,
}

impl DockerRuntime {
    pub fn new() -> DockerRuntime {
        DockerRuntime::default()
    }

    /// The client, connected and version-negotiated on first use (dockerd 20.10 refuses the
    /// newer API version bollard asks for by default).
    async fn client(&self) -> Result<&Docker, RuntimeError> {
        self.client
            .get_or_try_init(|| async {
                let docker = Docker::connect_with_local_defaults()
                    .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
                let docker =
                    bounded("negotiate Docker API version", docker.negotiate_version()).await?;
                Ok(docker.with_timeout(API_TIMEOUT))
            })
            .await
    }

    async fn run_sandbox(&self, spec: SandboxSpec) -> Result<RunOutcome, RuntimeError> {
        if !spec.init_binary.is_file() {
            return Err(RuntimeError::MissingInit {
                path: spec.init_binary.clone(),
            });
        }
        let docker = self.client().await?;
        let name = format!("sandgate-{}", spec.execution_id);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        bounded(
            "create container",
            docker.create_container(Some(options), container_body(&spec)),
        )
        .await?;
        let mut outcome = attach_start_wait(docker, &name, &spec).await;
        match cleanup::remove(docker, &name).await {
            Ok(()) => {
                if let Ok(run) = &mut outcome {
                    run.removed = true;
                }
            }
            Err(err) => {
                tracing::error!(container = %name, error = %err, "container left behind for the reaper");
            }
        }
        outcome
    }
}

impl SandboxRuntime for DockerRuntime {
    fn run(&self, spec: SandboxSpec) -> BoxFuture<'_, Result<RunOutcome, RuntimeError>> {
        self.run_sandbox(spec).boxed()
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
}

/// The container, with the isolation floor of DESIGN section 5. No policy input reaches here
/// except the limits, already bounded by the configured ceilings.
fn container_body(spec: &SandboxSpec) -> ContainerCreateBody {
    let limits = &spec.limits;
    // Programs may build and run binaries in /workspace and /tmp (test suites do); /output holds
    // data only.
    let tmpfs = |mb: u64, exec: &str| format!("rw,nosuid,nodev,{exec},size={mb}m,mode=1777");
    let mut tmpfs_mounts = HashMap::from([
        ("/workspace".to_owned(), tmpfs(limits.disk_mb, "exec")),
        ("/tmp".to_owned(), tmpfs(limits.disk_mb, "exec")),
    ]);
    // With an output area, /output is that host tmpfs (bind-mounted, see `mounts`), so its
    // files outlive the container and can be collected.
    if spec.output_dir.is_none() {
        tmpfs_mounts.insert("/output".to_owned(), tmpfs(limits.disk_mb, "noexec"));
    }
    let host_config = HostConfig {
        runtime: Some(spec.runtime.clone()),
        network_mode: Some("none".to_owned()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".to_owned()]),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        memory: Some(mb_to_bytes(limits.memory_mb)),
        memory_swap: Some(mb_to_bytes(limits.memory_mb)),
        nano_cpus: Some((limits.cpus * 1e9) as i64),
        pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".to_owned()),
            soft: Some(NOFILE),
            hard: Some(NOFILE),
        }]),
        tmpfs: Some(tmpfs_mounts),
        mounts: Some(mounts(spec)),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        auto_remove: Some(false),
        privileged: Some(false),
        ipc_mode: Some("private".to_owned()),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: Some(vec![INIT_PATH.to_owned()]),
        cmd: Some(vec![]),
        user: Some(SANDBOX_USER.to_owned()),
        working_dir: Some(spec.job.cwd.clone()),
        hostname: Some("sandbox".to_owned()),
        env: Some(
            spec.job
                .env
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect(),
        ),
        labels: Some(HashMap::from([
            (EXECUTION_LABEL.to_owned(), spec.execution_id.clone()),
            (INSTANCE_LABEL.to_owned(), spec.instance.clone()),
        ])),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        stop_timeout: Some(1),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// The init binary and the datasets: host paths, all read-only. The only writable host paths
/// are the execution's own egress socket directory and its output area (a tmpfs of its own).
fn mounts(spec: &SandboxSpec) -> Vec<Mount> {
    let read_only = |source: &std::path::Path, target: &str| Mount {
        target: Some(target.to_owned()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        ..Default::default()
    };
    let egress = spec.egress_dir.as_ref().map(|dir| Mount {
        target: Some(crate::egress::SANDBOX_SOCKET_DIR.to_owned()),
        source: Some(dir.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(false),
        ..Default::default()
    });
    let output = spec.output_dir.as_ref().map(|dir| Mount {
        target: Some(OUTPUT_PATH.to_owned()),
        source: Some(dir.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(false),
        ..Default::default()
    });
    std::iter::once(read_only(&spec.init_binary, INIT_PATH))
        .chain(spec.mounts.iter().map(|m| read_only(&m.source, &m.target)))
        .chain(egress)
        .chain(output)
        .collect()
}

/// Attaches (before starting, so no output is lost), starts, hands `sandbox-init` its job on
/// stdin, and collects capped output until the container exits or the deadline passes.
async fn attach_start_wait(
    docker: &Docker,
    name: &str,
    spec: &SandboxSpec,
) -> Result<RunOutcome, RuntimeError> {
    let attach = AttachContainerOptionsBuilder::new()
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .stream(true)
        .build();
    let attached = bounded(
        "attach container",
        docker.attach_container(name, Some(attach)),
    )
    .await?;
    let mut input = attached.input;
    let mut output = attached.output;
    // A fresh secret per run authenticates sandbox-init's exit trailer.
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let mut job = spec.job.clone();
    job.exit_nonce = Some(nonce.clone());
    let job = serde_json::to_vec(&job).map_err(|err| RuntimeError::Docker {
        operation: "encode job",
        message: err.to_string(),
    })?;

    let started_at = crate::ids::now_micros();
    let started = Instant::now();
    bounded("start container", docker.start_container(name, None)).await?;

    let cap = usize::try_from(spec.limits.output_bytes).unwrap_or(usize::MAX);
    let mut stdout = CappedOutput::default();
    let mut stderr = CappedOutput::default();
    let mut trailer = ExitTrailer::new(&nonce);
    let mut init_exit = None;
    // Keeps what fits under the cap and hands exactly that to the live stream.
    let keep = |out: &mut CappedOutput, channel: Channel, bytes: &[u8]| {
        let kept = out.push(bytes, cap);
        if let Some(sink) = &spec.sink {
            sink.push(channel, kept);
        }
    };
    let run = async {
        // A program that never reads stdin must not stall the hand-over: errors here show up
        // as the program's own failure.
        let handed_over = async {
            input.write_all(&job).await?;
            input.write_all(b"\n").await?;
            input.shutdown().await
        };
        if let Err(err) = handed_over.await {
            tracing::warn!(error = %err, "writing the job to sandbox-init failed");
        }
        while let Some(frame) = output.next().await {
            match frame {
                Ok(LogOutput::StdOut { message }) => keep(&mut stdout, Channel::Stdout, &message),
                Ok(LogOutput::StdErr { message }) => {
                    keep(&mut stderr, Channel::Stderr, &trailer.feed(&message));
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "reading sandbox output failed");
                    break;
                }
            }
        }
        let (held, code) = trailer.finish();
        keep(&mut stderr, Channel::Stderr, &held);
        init_exit = code.map(i64::from);
        wait_exit(docker, name).await
    };
    let (exit_code, timed_out, cancelled) = tokio::select! {
        finished = tokio::time::timeout(spec.timeout(), run) => match finished {
            Ok(exit) => (exit?, false, false),
            Err(_) => {
                kill(docker, name).await;
                (None, true, false)
            }
        },
        () = spec.cancel.cancelled() => {
            kill(docker, name).await;
            (None, false, true)
        }
    };
    let duration = started.elapsed();
    let mut state = bounded("inspect container", docker.inspect_container(name, None))
        .await?
        .state
        .unwrap_or_default();
    // Under runsc an OOM kills gVisor's kernel, not just the program: the init reports
    // nothing and the container ends with SIGKILL. dockerd learns of the OOM from a separate
    // cgroup event that can trail the exit, so look again for a moment before calling it
    // anything else.
    let sandbox_died = !timed_out && !cancelled && init_exit.is_none();
    for _ in 0..OOM_EVENT_POLLS {
        if !sandbox_died || state.oom_killed == Some(true) || state.exit_code != Some(137) {
            break;
        }
        tokio::time::sleep(OOM_EVENT_POLL).await;
        state = bounded("inspect container", docker.inspect_container(name, None))
            .await?
            .state
            .unwrap_or_default();
    }
    Ok(RunOutcome {
        exit_code: if timed_out || cancelled {
            None
        } else {
            exit_code.or(state.exit_code)
        },
        timed_out,
        cancelled,
        oom_killed: state.oom_killed.unwrap_or(false),
        init_exit: if timed_out || cancelled {
            None
        } else {
            init_exit
        },
        removed: false,
        stdout,
        stderr,
        started_at,
        duration,
    })
}

/// The container's exit code once it has stopped.
async fn wait_exit(docker: &Docker, name: &str) -> Result<Option<i64>, RuntimeError> {
    match docker.wait_container(name, None).next().await {
        Some(Ok(response)) => Ok(Some(response.status_code)),
        // bollard reports a non-zero exit as an error carrying the code.
        Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(Some(code)),
        Some(Err(err)) => Err(docker_error("wait container", err)),
        None => Ok(None),
    }
}

async fn kill(docker: &Docker, name: &str) {
    let options = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
    if let Err(err) = bounded("kill container", docker.kill_container(name, Some(options))).await {
        tracing::warn!(container = name, error = %err, "kill failed");
    }
    if tokio::time::timeout(KILL_GRACE, wait_exit(docker, name))
        .await
        .is_err()
    {
        tracing::warn!(container = name, "container did not stop after SIGKILL");
    }
}

pub(super) async fn bounded<T>(
    operation: &'static str,
    call: impl Future<Output = Result<T, BollardError>>,
) -> Result<T, RuntimeError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => result.map_err(|err| docker_error(operation, err)),
        Err(_) => Err(RuntimeError::Timeout {
            operation,
            seconds: API_TIMEOUT.as_secs(),
        }),
    }
}

fn docker_error(operation: &'static str, err: BollardError) -> RuntimeError {
    match err {
        BollardError::DockerResponseServerError { message, .. } => {
            RuntimeError::Docker { operation, message }
        }
        other => RuntimeError::Docker {
            operation,
            message: other.to_string(),
        },
    }
}

fn mb_to_bytes(mb: u64) -> i64 {
    i64::try_from(mb)
        .unwrap_or(i64::MAX / MIB)
        .saturating_mul(MIB)
}
