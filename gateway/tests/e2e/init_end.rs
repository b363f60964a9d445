//! A run ends on sandbox-init's word (its end marker on stdout, its trailer on stderr) only once
//! nothing of the program is left: through the real runtime (dockerd + runsc, the static
//! sandbox-init), cold and pooled. The program starts a leftover that left its process group
//! and session, ignores SIGTERM and rewrites a counter in `/output` as fast as it can; the test
//! reads that counter on the host the moment the run is over, and again later: it must not
//! have moved.
//!
//! What this shows is the property the gateway relies on, not which mechanism gives it: the
//! init's `quiesce` kills the leftover before the marker, and the init's own exit, which follows
//! its trailer within microseconds, makes gVisor kill every process of the sandbox as well. An
//! init that skipped `quiesce` passed this test too (tried: the window between its marker and
//! its exit is too short to observe from the host); `quiesce` closes that window by
//! construction.

use crate::common;

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use tokio_util::sync::CancellationToken;

use gateway::runtime::docker::DockerRuntime;
use gateway::runtime::{
    Ending, Job, JobFile, Owner, PoolRunner, Ran, RunControl, SandboxPlan, SandboxRuntime, Waits,
};
use policy_engine::Limits;

/// Starts the leftover, waits until it has written, then ends with 3.
const LEAVES_A_WRITER: &str = "setsid sh -c 'trap \"\" TERM HUP INT; i=0; \
     while :; do i=$((i+1)); echo $i > /output/n; done' </dev/null >/dev/null 2>&1 &\n\
     while [ ! -s /output/n ]; do sleep 0.01; done\n\
     echo started\n\
     exit 3\n";

async fn run(waits: Waits, image: &str, argv: Vec<String>, file: (&str, &str)) -> (Ran, String) {
    common::require_docker();
    let dirs = tempfile::tempdir().unwrap();
    let id = gateway::ids::new("ex");
    let (egress_dir, output_dir) = (dirs.path().join("egress"), dirs.path().join("output"));
    for dir in [&egress_dir, &output_dir] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // The program's uid writes the counter.
    std::process::Command::new("chown")
        .args(["65534:65534", output_dir.to_str().unwrap()])
        .status()
        .unwrap();
    let plan = SandboxPlan {
        id: id.clone(),
        owner: Owner::Execution(id),
        instance: "gw_init_end_test".to_owned(),
        image: image.to_owned(),
        runtime: "runsc".to_owned(),
        init_binary: common::sandbox_init(),
        limits: Limits {
            timeout_ms: 30_000,
            memory_mb: 512,
            cpus: 1.0,
            pids: 128,
            disk_mb: 64,
            output_bytes: 1 << 20,
        },
        mounts: vec![],
        egress_dir,
        output_dir: output_dir.clone(),
        env: gateway::app::launch::sandbox_env(1.0),
        waits,
    };
    let mut sandbox = DockerRuntime::new().start(plan).await.expect("sandbox");
    let (path, code) = file;
    let job = Job {
        argv,
        cwd: Some("/workspace".to_owned()),
        env: Some(gateway::app::launch::sandbox_env(1.0)),
        files: vec![JobFile {
            path: path.to_owned(),
            content_b64: base64::engine::general_purpose::STANDARD
                .encode(code)
                .into(),
            mode: Some(0o644),
        }],
        proxy: None,
        exit_nonce: None,
    };
    let control = RunControl {
        timeout: Duration::from_secs(30),
        output_cap: 1 << 20,
        sink: None,
        cancel: CancellationToken::new(),
    };
    let ran = sandbox.run(job, control).await.expect("run");
    let counter = still_counter(&output_dir).await;
    sandbox.discard().await;
    (ran, counter)
}

/// The counter as the run ended, checked unchanged after the sandbox had time to stop.
async fn still_counter(output: &Path) -> String {
    let at_end = std::fs::read_to_string(output.join("n")).unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later = std::fs::read_to_string(output.join("n")).unwrap_or_default();
    assert_eq!(
        at_end, later,
        "the leftover still wrote after the run was reported over"
    );
    at_end
}

fn assert_ended_on_the_inits_word(ran: &Ran) {
    assert!(ran.settled, "the program's end was not known: {ran:?}");
    assert!(matches!(ran.ending, Ending::Exited(3)), "{:?}", ran.ending);
    assert_eq!(ran.stdout.text(), "started\n");
}

#[tokio::test]
async fn a_cold_run_ends_only_once_its_leftovers_are_gone() {
    for _ in 0..2 {
        let (ran, _) = run(
            Waits::Init,
            "sandgate/bash",
            vec!["bash".into(), "/workspace/main.sh".into()],
            ("/workspace/main.sh", LEAVES_A_WRITER),
        )
        .await;
        assert_ended_on_the_inits_word(&ran);
    }
}

#[tokio::test]
async fn a_pooled_python_run_ends_only_once_its_leftovers_are_gone() {
    let code = format!(
        "import subprocess, sys\nsubprocess.run(['sh', '-c', {LEAVES_A_WRITER:?}], check=False)\n\
         sys.exit(3)\n"
    );
    let (ran, _) = run(
        Waits::Pool(PoolRunner::Python {
            preload: Vec::new(),
        }),
        "sandgate/python",
        vec!["python3".into(), "/workspace/main.py".into()],
        ("/workspace/main.py", &code),
    )
    .await;
    assert_ended_on_the_inits_word(&ran);
}
