//! Checkpoint and restore of a session's sandbox through dockerd's checkpoint API (experimental
//! mode; docs/snapshots.md says why this and not runsc driven directly). A checkpoint stops the
//! container (runsc 20221219 panics on `--leave-running`); a restore is a NEW container from a
//! plan like the first one's (its own egress socket directory and output area) whose own
//! checkpoint directory under dockerd's root receives a copy of the image, started with
//! `?checkpoint=`: dockerd refuses a custom checkpoint directory on start.

use std::path::{Path, PathBuf};

use bollard::container::CreateCheckpointOptions;
use bollard::Docker;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::call::{bounded, API_TIMEOUT};
use super::run::DockerSandbox;
use crate::runtime::{RuntimeError, Sandbox, SandboxPlan};

/// The checkpoint's name inside a restored container's own checkpoint directory.
const RESTORE_NAME: &str = "sandgate";
/// Most bytes of dockerd's answer to the start call that are read (its error message).
const MAX_ANSWER: u64 = 64 * 1024;

/// Checkpoints the running container into `image` (created by dockerd; its parent must exist)
/// and leaves it stopped. The image's files are made 0600: it holds the program's memory.
pub async fn checkpoint(docker: &Docker, name: &str, image: &Path) -> Result<(), RuntimeError> {
    let (parent, id) = split_image_path(image)?;
    // runsc stops the sandbox when a checkpoint fails part-way (a full disk): refuse first
    // what cannot fit, while it still runs.
    room_for(docker, name, &parent).await?;
    let options = CreateCheckpointOptions {
        checkpoint_id: id,
        checkpoint_dir: Some(parent.to_string_lossy().into_owned()),
        exit: true,
    };
    bounded(
        "checkpoint container",
        docker.create_checkpoint(name, options),
    )
    .await?;
    sweep_containerd_copies(Path::new(CONTAINERD_TMP), CONTAINERD_COPY_AGE);
    restrict(image).map_err(|err| io_error("restrict the checkpoint image", &err))
}

/// Refuses (`NoRoom`) a checkpoint when the file system under `dir` has less free space than
/// the container's memory in use: an upper bound of its image (runsc compresses it).
async fn room_for(docker: &Docker, name: &str, dir: &Path) -> Result<(), RuntimeError> {
    use futures_util::StreamExt;
    let free = free_bytes(dir).map_err(|err| io_error("measure the free space", &err))?;
    let options = bollard::query_parameters::StatsOptions {
        stream: false,
        one_shot: true,
    };
    let stats = bounded("container stats", async {
        docker.stats(name, Some(options)).next().await.transpose()
    })
    .await?;
    let needed = stats
        .and_then(|stats| stats.memory_stats)
        .and_then(|memory| memory.usage)
        .unwrap_or(0);
    if free < needed {
        return Err(RuntimeError::NoRoom {
            dir: dir.to_owned(),
            free,
            needed,
        });
    }
    Ok(())
}

/// Bytes an unprivileged writer may still put on the file system holding `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

/// Creates the plan's container, gives it the image and starts it restored.
pub async fn restore(
    docker: Docker,
    socket: &Path,
    plan: &SandboxPlan,
    image: &Path,
) -> Result<DockerSandbox, RuntimeError> {
    let began = std::time::Instant::now();
    let mut sandbox = DockerSandbox::create(docker.clone(), plan).await?;
    let created = began.elapsed();
    let started = async {
        let target = checkpoint_dir(&docker, &sandbox.name).await?;
        let located = began.elapsed();
        let from = image.to_owned();
        tokio::task::spawn_blocking(move || copy_image(&from, &target))
            .await
            .map_err(|err| io_error("hand the image to dockerd", &std::io::Error::other(err)))?
            .map_err(|err| io_error("hand the image to dockerd", &err))?;
        let copied = began.elapsed();
        start_restored(socket, &sandbox.name).await?;
        Ok::<_, RuntimeError>((located, copied))
    };
    match started.await {
        Ok((located, copied)) => {
            let run = began.elapsed();
            sandbox.watch_oom().await;
            // Where a restore's time goes (docs/snapshots.md, docs/performance.md).
            tracing::info!(
                container = %sandbox.name,
                create_ms = created.as_millis(),
                locate_ms = (located - created).as_millis(),
                copy_ms = (copied - located).as_millis(),
                start_ms = (run - copied).as_millis(),
                watch_ms = (began.elapsed() - run).as_millis(),
                "sandbox restored from its checkpoint"
            );
            sweep_containerd_copies(Path::new(CONTAINERD_TMP), CONTAINERD_COPY_AGE);
            Ok(sandbox)
        }
        Err(err) => {
            Box::new(sandbox).discard().await;
            Err(err)
        }
    }
}

/// The restored container's own checkpoint directory under dockerd's root, where the image
/// is handed over (`RESTORE_NAME`).
async fn checkpoint_dir(docker: &Docker, name: &str) -> Result<PathBuf, RuntimeError> {
    let (info, daemon) = tokio::join!(
        bounded("inspect container", docker.inspect_container(name, None)),
        bounded("docker info", docker.info()),
    );
    let id = info?.id.unwrap_or_default();
    let root = daemon?
        .docker_root_dir
        .unwrap_or_else(|| "/var/lib/docker".to_owned());
    Ok(PathBuf::from(root)
        .join("containers")
        .join(id)
        .join("checkpoints")
        .join(RESTORE_NAME))
}

/// Where dockerd 20.10's containerd copies a checkpoint it restores (its `TMPDIR`).
const CONTAINERD_TMP: &str = "/tmp";
/// A copy older than this is no restore's in progress (a restore takes seconds).
const CONTAINERD_COPY_AGE: std::time::Duration = std::time::Duration::from_secs(120);

/// Removes the copies of restored checkpoints containerd leaves behind: each restore leaves
/// a `ctrd-checkpoint<N>` directory holding the whole image (18 MB for a pandas session, seen
/// here with dockerd 20.10), never removed, so refilling the pool by restore would fill the
/// disk. Only directories of that name older than `age` are removed; failures are logged.
fn sweep_containerd_copies(tmp: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("ctrd-checkpoint") {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
        if old && is_dir {
            if let Err(err) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(path = %entry.path().display(), error = %err, "containerd's copy of a restored checkpoint not removed");
            }
        }
    }
}

/// `POST /containers/{name}/start?checkpoint=...`: bollard's start has no such parameter.
async fn start_restored(socket: &Path, name: &str) -> Result<(), RuntimeError> {
    let call = async {
        let mut stream = UnixStream::connect(socket).await?;
        let request = format!(
            "POST /containers/{name}/start?checkpoint={RESTORE_NAME} HTTP/1.1\r\n\
             Host: docker\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(MAX_ANSWER).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(err)) => return Err(io_error("start restored container", &err)),
        Err(_) => {
            return Err(RuntimeError::Timeout {
                operation: "start restored container",
                seconds: API_TIMEOUT.as_secs(),
            })
        }
    };
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).unwrap_or_default();
    // 204 No Content: dockerd started the restored container.
    if status.parse::<u16>() == Ok(204) {
        return Ok(());
    }
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    Err(RuntimeError::Docker {
        operation: "start restored container",
        message: format!("dockerd answered {status}: {}", body.trim()),
    })
}

/// The socket dockerd listens on: the runtime's, else `DOCKER_HOST`'s, else the default.
pub fn daemon_socket(configured: Option<&Path>) -> PathBuf {
    if let Some(socket) = configured {
        return socket.to_owned();
    }
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

fn split_image_path(image: &Path) -> Result<(PathBuf, String), RuntimeError> {
    match (image.parent(), image.file_name()) {
        (Some(parent), Some(id)) => Ok((parent.to_owned(), id.to_string_lossy().into_owned())),
        _ => Err(RuntimeError::Docker {
            operation: "checkpoint container",
            message: format!("{} names no image directory", image.display()),
        }),
    }
}

/// The image directory 0700 and its files 0600.
fn restrict(image: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(image, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(image)? {
        let path = entry?.path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Copies the image's files (a flat directory) into `target`, 0600 under 0700.
fn copy_image(image: &Path, target: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(target)?;
    for entry in std::fs::read_dir(image)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), target.join(entry.file_name()))?;
        }
    }
    restrict(target)
}

fn io_error(operation: &'static str, err: &std::io::Error) -> RuntimeError {
    RuntimeError::Docker {
        operation,
        message: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_old_containerd_copies_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("ctrd-checkpoint1");
        let other = tmp.path().join("other-dir");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("checkpoint.img"), b"x").unwrap();
        std::fs::create_dir(&other).unwrap();
        sweep_containerd_copies(tmp.path(), std::time::Duration::from_secs(3600));
        assert!(old.exists(), "a recent copy may be a restore in progress");
        sweep_containerd_copies(tmp.path(), std::time::Duration::ZERO);
        assert!(!old.exists());
        assert!(other.exists(), "nothing else is touched");
    }

    #[test]
    fn an_image_path_splits_into_dockerds_directory_and_checkpoint_id() {
        let (parent, id) = split_image_path(Path::new("/snap/ss_1/pause")).unwrap();
        assert_eq!(parent, Path::new("/snap/ss_1"));
        assert_eq!(id, "pause");
        assert!(split_image_path(Path::new("/")).is_err());
    }

    #[test]
    fn a_configured_socket_wins() {
        assert_eq!(
            daemon_socket(Some(Path::new("/tmp/d.sock"))),
            Path::new("/tmp/d.sock")
        );
    }
}
