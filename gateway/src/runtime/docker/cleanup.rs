//! Removing sandbox containers for good, including the case this runsc release is known for: a
//! container that failed to start leaves `runsc-sandbox`/`runsc-gofer` processes behind, and
//! `docker rm -f` cannot remove it until they are killed.

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::call::bounded;
use crate::runtime::{
    Owner, RuntimeError, SandboxInfo, EXECUTION_LABEL, INSTANCE_LABEL, POOL_LABEL,
};

const REMOVE_ATTEMPTS: u32 = 3;

/// Force-removes a container by name or id. If dockerd keeps refusing, kills the runsc
/// processes that hold it and tries once more.
pub async fn remove(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    let mut last = None;
    for attempt in 1..=REMOVE_ATTEMPTS {
        match remove_once(docker, name).await {
            Ok(()) => return Ok(()),
            Err(err) => {
                tracing::warn!(container = name, attempt, error = %err, "remove failed");
                last = Some(err);
                tokio::time::sleep(Duration::from_millis(300 * u64::from(attempt))).await;
            }
        }
    }
    if let Ok(info) = bounded("inspect container", docker.inspect_container(name, None)).await {
        if let Some(id) = info.id {
            let killed = kill_runsc_processes(&id);
            tracing::warn!(container = name, killed, "killed wedged runsc processes");
            if remove_once(docker, name).await.is_ok() {
                return Ok(());
            }
        }
    }
    Err(last.unwrap_or(RuntimeError::Docker {
        operation: "remove container",
        message: "could not remove".to_owned(),
    }))
}

async fn remove_once(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    let options = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match bounded(
        "remove container",
        docker.remove_container(name, Some(options)),
    )
    .await
    {
        Err(RuntimeError::Docker { message, .. })
            if message.contains("No such container")
                || message.contains("is already in progress") =>
        {
            Ok(())
        }
        other => other,
    }
}

/// SIGKILLs every runsc process whose command line names the container id. Returns how many.
fn kill_runsc_processes(container_id: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("runsc")
            && cmdline.contains(container_id)
            && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Every sandbox container: each carries the instance label, and an execution or pool label.
pub async fn list(docker: &Docker) -> Result<Vec<SandboxInfo>, RuntimeError> {
    let filters = HashMap::from([("label", vec![INSTANCE_LABEL])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let containers = bounded("list containers", docker.list_containers(Some(options))).await?;
    Ok(containers
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels?;
            let owner = match (labels.get(EXECUTION_LABEL), labels.get(POOL_LABEL)) {
                (Some(execution), _) => Owner::Execution(execution.clone()),
                (None, Some(language)) => Owner::Pool {
                    language: language.clone(),
                },
                (None, None) => return None,
            };
            let name = c.names?.first()?.trim_start_matches('/').to_owned();
            Some(SandboxInfo {
                container_id: c.id?,
                name,
                owner,
                instance: labels.get(INSTANCE_LABEL).cloned(),
            })
        })
        .collect())
}
