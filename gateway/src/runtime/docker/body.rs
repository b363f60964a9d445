//! The container a [`SandboxPlan`] becomes, with the isolation floor no policy can lower:
//! network `none`, a read-only root, size-capped tmpfs for `/workspace`, `/tmp` and
//! `/home/user` (each capped at the decision's disk size), every
//! capability dropped but the two sandbox-init (PID 1) needs to leave uid 0, no-new-privileges,
//! memory = memory + swap, CPU, pids and open-file limits, log driver `none`. No policy input
//! reaches here except the limits, already bounded by the configured ceilings.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, ResourcesUlimits,
};

use crate::runtime::{
    Owner, SandboxPlan, Waits, EXECUTION_LABEL, INIT_PATH, INSTANCE_LABEL, OUTPUT_PATH, POOL_LABEL,
    SANDBOX_SOCKET_DIR, USER_HOME, WORKSPACE,
};

const MIB: i64 = 1024 * 1024;
/// Open files per sandbox process.
const NOFILE: i64 = 1024;
/// The container starts as root with exactly [`INIT_CAPABILITIES`]: sandbox-init, PID 1, uses
/// them once to take a uid of its own and run every program as 65534:65534, so that no program
/// can signal it; leaving uid 0 clears both (sandbox-init's `identity` module).
const CONTAINER_USER: &str = "0:0";
const INIT_CAPABILITIES: [&str; 2] = ["SETUID", "SETGID"];

pub fn container_body(plan: &SandboxPlan) -> ContainerCreateBody {
    let limits = &plan.limits;
    // Programs may build and run binaries in /workspace, /tmp and the home (test suites do;
    // runsc creates the home's mount point when an image lacks it); /output
    // (the host tmpfs of `mounts`, so its files outlive the container) holds data only.
    let tmpfs = |mb: u64| format!("rw,nosuid,nodev,exec,size={mb}m,mode=1777");
    let host_config = HostConfig {
        runtime: Some(plan.runtime.clone()),
        network_mode: Some("none".to_owned()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".to_owned()]),
        cap_add: Some(INIT_CAPABILITIES.map(str::to_owned).to_vec()),
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
        tmpfs: Some(HashMap::from([
            (WORKSPACE.to_owned(), tmpfs(limits.disk_mb)),
            ("/tmp".to_owned(), tmpfs(limits.disk_mb)),
            (USER_HOME.to_owned(), tmpfs(limits.disk_mb)),
        ])),
        mounts: Some(mounts(plan)),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        auto_remove: Some(false),
        privileged: Some(false),
        // sandbox-init must be PID 1 whatever dockerd's default (`"init": true` in daemon.json
        // would put docker-init there): only as PID 1 does it leave uid 0 before the program.
        init: Some(false),
        ipc_mode: Some("private".to_owned()),
        ..Default::default()
    };
    let owner = match &plan.owner {
        Owner::Execution(id) => (EXECUTION_LABEL.to_owned(), id.clone()),
        Owner::Pool { language } => (POOL_LABEL.to_owned(), language.clone()),
    };
    let cmd = match &plan.waits {
        Waits::Init => Vec::new(),
        Waits::Pool(runner) => runner.init_args(),
        Waits::Session(runner) => runner.init_args(),
    };
    ContainerCreateBody {
        image: Some(plan.image.clone()),
        entrypoint: Some(vec![INIT_PATH.to_owned()]),
        cmd: Some(cmd),
        user: Some(CONTAINER_USER.to_owned()),
        working_dir: Some(WORKSPACE.to_owned()),
        hostname: Some("sandbox".to_owned()),
        env: Some(
            plan.env
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect(),
        ),
        labels: Some(HashMap::from([
            owner,
            (INSTANCE_LABEL.to_owned(), plan.instance.clone()),
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
/// are the sandbox's own egress socket directory and its output area (a tmpfs of its own).
fn mounts(plan: &SandboxPlan) -> Vec<Mount> {
    let bind = |source: &Path, target: &str, read_only: bool| Mount {
        target: Some(target.to_owned()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    };
    std::iter::once(bind(&plan.init_binary, INIT_PATH, true))
        .chain(plan.mounts.iter().map(|m| bind(&m.source, &m.target, true)))
        .chain([
            bind(&plan.egress_dir, SANDBOX_SOCKET_DIR, false),
            bind(&plan.output_dir, OUTPUT_PATH, false),
        ])
        .collect()
}

fn mb_to_bytes(mb: u64) -> i64 {
    i64::try_from(mb)
        .unwrap_or(i64::MAX / MIB)
        .saturating_mul(MIB)
}
