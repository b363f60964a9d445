//! Session sandboxes through the real runtime (dockerd + runsc, the static sandbox-init): one
//! resident runner serving many turns, state kept between them, interrupts survived, an OOM
//! ending the sandbox. See sandbox-protocol's session module for the protocol.

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use tokio_util::sync::CancellationToken;

use gateway::runtime::docker::DockerRuntime;
use gateway::runtime::{
    Ending, Job, JobFile, Owner, RunControl, Sandbox, SandboxPlan, SandboxRuntime, SessionRunner,
    TurnEnding, TurnRan, Waits,
};
use policy_engine::Limits;

/// A started session sandbox and the directories it was given.
struct Session {
    sandbox: Box<dyn Sandbox>,
    language: &'static str,
    turns: u32,
    _dirs: tempfile::TempDir,
}

async fn open(language: &'static str, memory_mb: u64) -> Session {
    common::require_docker();
    let dirs = tempfile::tempdir().unwrap();
    let id = gateway::ids::new("ss");
    let (egress_dir, output_dir) = (dirs.path().join("egress"), dirs.path().join("output"));
    for dir in [&egress_dir, &output_dir] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let runner = SessionRunner::for_language(language).unwrap();
    let plan = SandboxPlan {
        id: id.clone(),
        owner: Owner::Execution(id),
        instance: "gw_session_runner_test".to_owned(),
        image: format!("sandgate/{language}"),
        runtime: "runsc".to_owned(),
        init_binary: common::sandbox_init(),
        limits: Limits {
            timeout_ms: 10_000,
            memory_mb,
            cpus: 1.0,
            pids: 128,
            disk_mb: 64,
            output_bytes: 1 << 20,
        },
        mounts: vec![],
        egress_dir,
        output_dir,
        env: gateway::app::launch::sandbox_env(1.0),
        waits: Waits::Session(runner),
    };
    let mut sandbox = DockerRuntime::new()
        .start(plan)
        .await
        .expect("session sandbox");
    let opening = Job {
        argv: vec![language.to_owned()],
        cwd: Some("/workspace".to_owned()),
        env: Some(gateway::app::launch::sandbox_env(1.0)),
        files: vec![],
        proxy: None,
        exit_nonce: None,
    };
    sandbox.open_session(opening).await.expect("opening line");
    Session {
        sandbox,
        language,
        turns: 0,
        _dirs: dirs,
    }
}

impl Session {
    async fn run(&mut self, code: &str, timeout: Duration) -> TurnRan {
        self.turns += 1;
        let ext = if self.language == "python" {
            "py"
        } else {
            "sh"
        };
        let cell = format!("/tmp/sandgate-cells/{}.{ext}", self.turns);
        let job = Job {
            argv: vec![cell.clone()],
            cwd: None,
            env: None,
            files: vec![JobFile {
                path: cell,
                content_b64: base64::engine::general_purpose::STANDARD
                    .encode(code)
                    .into(),
                mode: Some(0o644),
            }],
            proxy: None,
            exit_nonce: None,
        };
        let control = RunControl {
            timeout,
            output_cap: 1 << 20,
            sink: None,
            cancel: CancellationToken::new(),
        };
        self.sandbox.turn(job, control).await.expect("turn")
    }

    async fn close(self) {
        self.sandbox.discard().await;
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// The code and result of an answered turn (its rich results: `session_results.rs`).
fn exited(ending: &TurnEnding) -> (u8, Option<String>) {
    match ending {
        TurnEnding::Exited { code, result, .. } => (*code, result.clone()),
        other => panic!("the turn was not answered: {other:?}"),
    }
}

#[tokio::test]
async fn python_state_persists_and_the_last_expression_is_the_result() {
    let mut session = open("python", 512).await;
    let first = session.run("x = 41\nprint('set')", 30 * SECOND).await;
    assert_eq!(exited(&first.ending), (0, None));
    assert_eq!(first.stdout.text(), "set\n");
    let second = session.run("x + 1", 30 * SECOND).await;
    assert_eq!(exited(&second.ending), (0, Some("42".into())));
    assert_eq!(second.stdout.text(), "");
    // Imports and files persist.
    session
        .run(
            "import pandas as pd\nopen('/workspace/data.csv', 'w').write('a\\n1\\n2\\n')",
            60 * SECOND,
        )
        .await;
    let used = session
        .run(
            "int(pd.read_csv('/workspace/data.csv')['a'].sum())",
            30 * SECOND,
        )
        .await;
    assert_eq!(exited(&used.ending), (0, Some("3".into())));
    // An exception fails the turn, with its traceback, and the session goes on.
    let failed = session.run("1 / 0", 30 * SECOND).await;
    assert_eq!(exited(&failed.ending), (1, None));
    assert!(
        failed.stderr.text().contains("ZeroDivisionError"),
        "{}",
        failed.stderr.text()
    );
    assert!(!failed.stderr.text().contains("sandgate-end"));
    let after = session.run("x", 30 * SECOND).await;
    assert_eq!(exited(&after.ending), (0, Some("41".into())));
    session.close().await;
}

#[tokio::test]
async fn a_python_timeout_interrupts_the_cell_and_the_session_survives() {
    let mut session = open("python", 512).await;
    session.run("x = 7", 30 * SECOND).await;
    let spun = session.run("while True:\n    pass", SECOND).await;
    assert_eq!(spun.ending, TurnEnding::TimedOut { recovered: true });
    assert!(spun.stderr.text().contains("KeyboardInterrupt"));
    let alive = session.run("print('alive')\nx", 30 * SECOND).await;
    assert_eq!(alive.stdout.text(), "alive\n");
    assert_eq!(exited(&alive.ending), (0, Some("7".into())));
    session.close().await;
}

#[tokio::test]
async fn bash_cwd_variables_and_functions_persist() {
    let mut session = open("bash", 256).await;
    let first = session
        .run("cd /tmp; export A=1; greet() { echo hi $1; }", 30 * SECOND)
        .await;
    assert_eq!(exited(&first.ending), (0, None));
    let second = session
        .run("pwd; echo $A; greet you; false", 30 * SECOND)
        .await;
    assert_eq!(second.stdout.text(), "/tmp\n1\nhi you\n");
    assert_eq!(exited(&second.ending), (1, None));
    let slept = session.run("sleep 30", SECOND).await;
    assert_eq!(slept.ending, TurnEnding::TimedOut { recovered: true });
    let third = session.run("echo $A", 30 * SECOND).await;
    assert_eq!(third.stdout.text(), "1\n");
    session.close().await;
}

#[tokio::test]
async fn an_oom_ends_the_session_sandbox() {
    let mut session = open("python", 128).await;
    session.run("x = 1", 30 * SECOND).await;
    let hog = session
        .run(
            "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))",
            60 * SECOND,
        )
        .await;
    assert!(
        matches!(hog.ending, TurnEnding::Ended(Ending::Oom { .. })),
        "{:?}",
        hog.ending
    );
    assert!(!hog.ending.session_lives());
    session.close().await;
}
