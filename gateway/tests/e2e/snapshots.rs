//! Snapshots through the real stack (DESIGN 15; docs/snapshots.md): PostgreSQL, runsc and a
//! private dockerd in experimental mode (its checkpoint API; the machine's shared daemon is
//! not experimental and is never reconfigured). The daemon is shared by this area's tests
//! while any of them runs, and loads the python image once (about a minute).

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use common::TestGateway;
use serde_json::{json, Value};

#[allow(dead_code)] // the helper serves dockerd_restart.rs too, which uses the rest of it
#[path = "../dockerd_restart/daemon.rs"]
pub(crate) mod daemon;

pub(crate) use daemon::PrivateDockerd;
use gateway::runtime::docker::DockerRuntime;

static DAEMON: Mutex<Weak<PrivateDockerd>> = Mutex::new(Weak::new());

/// The area's experimental dockerd, started (with the python image) by the first test that
/// needs it and stopped when the last one holding it ends.
pub(crate) async fn shared_daemon() -> Arc<PrivateDockerd> {
    tokio::task::spawn_blocking(|| {
        let mut slot = DAEMON
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(daemon) = slot.upgrade() {
            return daemon;
        }
        let daemon = PrivateDockerd::start_experimental();
        daemon.load_image("sandgate/python");
        let daemon = Arc::new(daemon);
        *slot = Arc::downgrade(&daemon);
        daemon
    })
    .await
    .unwrap()
}

async fn gateway_on(daemon: &PrivateDockerd) -> TestGateway {
    let url = common::fresh_database().await;
    let data_dir = tempfile::tempdir().unwrap();
    gateway_with(daemon, url, data_dir, |_| {}).await
}

/// A gateway with snapshots on, no warm pool, on `daemon`, `url` and `data_dir` (a restart
/// passes the ones the stopped gateway had), and `tweak`'s changes to the config.
pub(crate) async fn gateway_with(
    daemon: &PrivateDockerd,
    url: String,
    data_dir: tempfile::TempDir,
    tweak: impl FnOnce(&mut gateway::config::Config),
) -> TestGateway {
    TestGateway::start_on(
        DockerRuntime::at(&daemon.socket()),
        Some(url),
        data_dir,
        |config| {
            config.snapshots.enabled = true;
            config.warm_pool = BTreeMap::new();
            tweak(config);
        },
    )
    .await
}

pub(crate) async fn open(gw: &TestGateway, key: &str, language: &str) -> String {
    let (status, session) = gw
        .post(key, "/v1/sessions", &json!({"language": language}))
        .await;
    assert_eq!(status, 201, "{session}");
    session["id"].as_str().unwrap().to_owned()
}

pub(crate) async fn run(gw: &TestGateway, key: &str, id: &str, code: &str) -> Value {
    let (status, record) = gw
        .post(
            key,
            &format!("/v1/sessions/{id}/executions"),
            &json!({"code": code}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    record
}

pub(crate) async fn step(gw: &TestGateway, key: &str, id: &str, what: &str) -> (u16, Value) {
    gw.post(key, &format!("/v1/sessions/{id}/{what}"), &json!({}))
        .await
}

pub(crate) async fn pause(gw: &TestGateway, key: &str, id: &str) -> Value {
    let (status, paused) = step(gw, key, id, "pause").await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["status"], "paused", "{paused}");
    paused
}

pub(crate) async fn events(gw: &TestGateway, kind: &str, session: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT decision FROM audit_events WHERE kind = $1 AND input->>'session_id' = $2 \
         ORDER BY id",
    )
    .bind(kind)
    .bind(session)
    .fetch_all(&gw.pool().await)
    .await
    .unwrap()
}

/// The paused session's checkpoint image files under the snapshots directory.
pub(crate) fn image_files(gw: &TestGateway, session: &str) -> Vec<std::path::PathBuf> {
    let root = gw.data_dir.path().join("snapshots");
    let mut found = Vec::new();
    for tenant in std::fs::read_dir(&root).unwrap() {
        for image in std::fs::read_dir(tenant.unwrap().path()).unwrap() {
            let image = image.unwrap().path();
            if image
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(session)
            {
                for file in std::fs::read_dir(&image).unwrap() {
                    found.push(file.unwrap().path());
                }
            }
        }
    }
    found
}

const SETUP_STATE: &str = "\
import json, os
x = 41
os.makedirs('/workspace/d', exist_ok=True)
os.chdir('/workspace/d')
open('f.txt', 'w').write('kept')
fh = open('/tmp/open.txt', 'w+')
fh.write('open-file')
fh.flush()";

const READ_STATE: &str =
    "(x + 1, json.dumps([1]), os.getcwd(), open('f.txt').read(), (fh.seek(0), fh.read())[1])";

const STATE: &str = "(42, '[1]', '/workspace/d', 'kept', 'open-file')";

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_keep_variables_imports_open_files_cwd_and_the_workspace() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, "python").await;
    run(&gw, &agent, &id, SETUP_STATE).await;

    let paused = pause(&gw, &agent, &id).await;
    assert_eq!(paused["id"], id.as_str());
    let instance = gw.instance().await;
    assert!(
        daemon.containers_of(&instance).is_empty(),
        "a paused session holds no container"
    );
    // Files 0600 under 0700 directories; the chain names the image's sha256.
    let files = image_files(&gw, &id);
    assert!(!files.is_empty());
    for file in &files {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
        let dir = std::fs::metadata(file.parent().unwrap()).unwrap();
        assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    }
    let recorded = events(&gw, "session.paused", &id).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["sha256"].as_str().unwrap().len(), 64);

    // Another tenant's agent cannot pause or resume it.
    let other = gw.key("agent", "globex").await;
    assert_eq!(step(&gw, &other, &id, "resume").await.0, 404);
    assert_eq!(step(&gw, &other, &id, "pause").await.0, 404);

    let (status, resumed) = step(&gw, &agent, &id, "resume").await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["status"], "ready", "{resumed}");
    assert_eq!(daemon.containers_of(&instance).len(), 1);
    let read = run(&gw, &agent, &id, READ_STATE).await;
    assert_eq!(read["result"], STATE, "{read}");
    assert!(read.get("resumed").is_none(), "{read}");

    // An execution sent to a paused session resumes it first, and says so.
    pause(&gw, &agent, &id).await;
    let read = run(&gw, &agent, &id, READ_STATE).await;
    assert_eq!(read["result"], STATE, "{read}");
    assert_eq!(read["resumed"], true, "{read}");
    assert_eq!(events(&gw, "session.resumed", &id).await.len(), 2);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_pause_resume_cycles_keep_files_and_variables() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, "python").await;
    run(&gw, &agent, &id, "n = 0").await;
    const CYCLES: usize = 20;
    for cycle in 1..=CYCLES {
        pause(&gw, &agent, &id).await;
        let code = format!(
            "n += 1\nopen('/workspace/c{cycle}.txt', 'w').write(str(n))\n\
             (n, sorted(f for f in __import__('os').listdir('/workspace') if f.startswith('c')))"
        );
        let record = run(&gw, &agent, &id, &code).await;
        let names: Vec<String> = (1..=cycle).map(|c| format!("'c{c}.txt'")).collect();
        let mut names = names;
        names.sort();
        let wanted = format!("({cycle}, [{}])", names.join(", "));
        assert_eq!(record["result"], wanted.as_str(), "cycle {cycle}: {record}");
        assert_eq!(record["resumed"], true);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_byte_in_the_image_refuses_the_restore_and_is_audited() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, "bash").await;
    run(&gw, &agent, &id, "X=kept").await;
    pause(&gw, &agent, &id).await;
    let image = image_files(&gw, &id)
        .into_iter()
        .find(|file| file.ends_with("checkpoint.img"))
        .expect("the checkpoint image");
    let mut bytes = std::fs::read(&image).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&image, &bytes).unwrap();

    let (status, refused) = step(&gw, &agent, &id, "resume").await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused
            .to_string()
            .contains("does not match its recorded sha256"),
        "{refused}"
    );
    let (status, _) = gw
        .post(
            &agent,
            &format!("/v1/sessions/{id}/executions"),
            &json!({"code": "echo $X"}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(gw.session(&agent, &id).await["status"], "paused");
    assert!(daemon.containers_of(&gw.instance().await).is_empty());
    assert_eq!(events(&gw, "snapshot.corrupt", &id).await.len(), 2);
    assert!(events(&gw, "session.resumed", &id).await.is_empty());

    // Put back, it restores.
    bytes[middle] ^= 0x01;
    std::fs::write(&image, &bytes).unwrap();
    let record = run(&gw, &agent, &id, "echo $X").await;
    assert_eq!(record["stdout"], "kept\n", "{record}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_during_an_execution_is_refused_with_409() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, "bash").await;
    let (status, running) = gw
        .post(
            &agent,
            &format!("/v1/sessions/{id}/executions"),
            &json!({"code": "sleep 3; echo done", "wait": false}),
        )
        .await;
    assert_eq!(status, 202, "{running}");
    let (status, refused) = step(&gw, &agent, &id, "pause").await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused.to_string().contains("running an execution"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    pause(&gw, &agent, &id).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn three_forks_of_one_snapshot_diverge_and_other_tenants_see_none_of_it() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let parent = open(&gw, &agent, "python").await;
    run(
        &gw,
        &agent,
        &parent,
        "import json\nbase = [1, 2]\nopen('/workspace/shared.txt', 'w').write('base')",
    )
    .await;
    let (status, snapshot) = gw
        .post(
            &agent,
            &format!("/v1/sessions/{parent}/snapshots"),
            &json!({}),
        )
        .await;
    assert_eq!(status, 201, "{snapshot}");
    let snapshot_id = snapshot["id"].as_str().unwrap().to_owned();
    assert!(snapshot_id.starts_with("sn_"), "{snapshot}");
    assert_eq!(snapshot["session_id"], parent.as_str());
    assert_eq!(snapshot["sha256"].as_str().unwrap().len(), 64);
    assert!(snapshot["bytes"].as_i64().unwrap() > 0);
    assert!(snapshot.get("path").is_none(), "{snapshot}");
    // The session went on: its state is there and it was never paused.
    let going_on = run(&gw, &agent, &parent, "base.append(3)\nbase").await;
    assert_eq!(going_on["result"], "[1, 2, 3]", "{going_on}");
    assert!(going_on.get("resumed").is_none());

    let mut forks = Vec::new();
    for _ in 0..3 {
        let (status, fork) = gw
            .post(
                &agent,
                "/v1/sessions",
                &json!({"language": "python", "from_snapshot": snapshot_id}),
            )
            .await;
        assert_eq!(status, 201, "{fork}");
        assert_eq!(fork["status"], "ready", "{fork}");
        forks.push(fork["id"].as_str().unwrap().to_owned());
    }
    for (i, fork) in forks.iter().enumerate() {
        let code = format!(
            "base.append({i})\nopen('/workspace/shared.txt', 'a').write('-{i}')\n\
             (base, open('/workspace/shared.txt').read())"
        );
        let record = run(&gw, &agent, fork, &code).await;
        assert_eq!(
            record["result"],
            format!("([1, 2, {i}], 'base-{i}')").as_str(),
            "{record}"
        );
    }
    // Each went its own way: writing in one changed nothing in another or in the parent.
    for (i, fork) in forks.iter().enumerate() {
        let record = run(
            &gw,
            &agent,
            fork,
            "(base, open('/workspace/shared.txt').read())",
        )
        .await;
        assert_eq!(
            record["result"],
            format!("([1, 2, {i}], 'base-{i}')").as_str()
        );
    }
    let record = run(
        &gw,
        &agent,
        &parent,
        "(base, open('/workspace/shared.txt').read())",
    )
    .await;
    assert_eq!(record["result"], "([1, 2, 3], 'base')");

    // Lineage: each fork's session.created names the snapshot and the parent session.
    let pool = gw.pool().await;
    for fork in &forks {
        let input: Value = sqlx::query_scalar(
            "SELECT input FROM audit_events WHERE kind = 'session.created' \
             AND input->>'session_id' = $1",
        )
        .bind(fork)
        .fetch_one(&pool)
        .await
        .unwrap();
        let from = &input["request"]["request"]["from_snapshot"];
        assert_eq!(from["id"], snapshot_id.as_str(), "{input}");
        assert_eq!(from["session_id"], parent.as_str(), "{input}");
    }
    let created = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM audit_events WHERE kind = 'snapshot.created' \
         AND input->>'snapshot_id' = $1 AND decision->>'sha256' = $2",
    )
    .bind(&snapshot_id)
    .bind(snapshot["sha256"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(created, 1);

    // Another tenant: 404 on the snapshot, on forking it, on deleting it; not in its list.
    let other = gw.key("agent", "globex").await;
    let path = format!("/v1/snapshots/{snapshot_id}");
    assert_eq!(gw.get(&other, &path).await.0, 404);
    assert_eq!(gw.delete(&other, &path).await.0, 404);
    let (status, _) = gw
        .post(
            &other,
            "/v1/sessions",
            &json!({"language": "python", "from_snapshot": snapshot_id}),
        )
        .await;
    assert_eq!(status, 404);
    let (_, listed) = gw.get(&other, "/v1/snapshots").await;
    assert_eq!(listed["snapshots"], json!([]), "{listed}");
    let (_, listed) = gw.get(&agent, "/v1/snapshots").await;
    assert_eq!(
        listed["snapshots"][0]["id"],
        snapshot_id.as_str(),
        "{listed}"
    );

    // Deleted: its image is gone, and nothing forks from it any more.
    let (status, _) = gw
        .delete(&agent, &format!("/v1/sessions/{}", forks[0]))
        .await;
    assert_eq!(status, 200, "a place under max_sessions for the last fork");
    let (status, deleted) = gw.delete(&agent, &path).await;
    assert_eq!(status, 200, "{deleted}");
    assert!(image_files(&gw, &snapshot_id).is_empty());
    assert_eq!(gw.get(&agent, &path).await.0, 404);
    let (status, _) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "python", "from_snapshot": snapshot_id}),
        )
        .await;
    assert_eq!(status, 404);
    gw.stop().await;
}

/// Not a pass/fail bound (DESIGN 8 ratios belong to `make bench`): prints how long a pause, a
/// resume to the first result, and a fork of a session with pandas loaded and a 100k-row
/// DataFrame built take, against a cold session building the same, in one run.
#[tokio::test(flavor = "multi_thread")]
async fn measure_pause_resume_and_a_pandas_fork_against_a_cold_session() {
    use std::time::Instant;
    const BUILD: &str =
        "import pandas as pd\ndf = pd.DataFrame({'a': range(100000)})\nint(df['a'].sum())";
    const USE: &str = "int(df['a'].sum())";
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;

    let cold = Instant::now();
    let id = open(&gw, &agent, "python").await;
    let built = run(&gw, &agent, &id, BUILD).await;
    let cold = cold.elapsed();
    assert_eq!(built["result"], "4999950000");

    let paused = Instant::now();
    pause(&gw, &agent, &id).await;
    let paused = paused.elapsed();
    let bytes = events(&gw, "session.paused", &id).await[0]["bytes"].clone();
    let resumed = Instant::now();
    let first = run(&gw, &agent, &id, USE).await;
    let resumed = resumed.elapsed();
    assert_eq!(first["result"], "4999950000");

    let (status, snapshot) = gw
        .post(&agent, &format!("/v1/sessions/{id}/snapshots"), &json!({}))
        .await;
    assert_eq!(status, 201, "{snapshot}");
    let forked = Instant::now();
    let (status, fork) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "python", "from_snapshot": snapshot["id"]}),
        )
        .await;
    assert_eq!(status, 201, "{fork}");
    let first = run(&gw, &agent, fork["id"].as_str().unwrap(), USE).await;
    let forked = forked.elapsed();
    assert_eq!(first["result"], "4999950000");
    eprintln!(
        "snapshots: cold open+build {cold:?}; pause {paused:?} ({bytes} bytes); \
         resume to first result {resumed:?} ({:.2}x cold); fork to first result {forked:?} \
         ({:.2}x cold)",
        resumed.as_secs_f64() / cold.as_secs_f64(),
        forked.as_secs_f64() / cold.as_secs_f64()
    );
    gw.stop().await;
}

pub(crate) async fn status_becomes(gw: &TestGateway, key: &str, id: &str, wanted: &str) -> Value {
    let mut seen = Value::Null;
    for _ in 0..300 {
        seen = gw.session(key, id).await;
        if seen["status"] == wanted {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("session {id} never became {wanted}: {seen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_session_pauses_by_default_and_closes_when_asked() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "bash", "idle_timeout_s": 1}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    run(&gw, &agent, &id, "cd /tmp && X=idle").await;
    status_becomes(&gw, &agent, &id, "paused").await;
    assert!(daemon.containers_of(&gw.instance().await).is_empty());
    let record = run(&gw, &agent, &id, "echo $X $PWD").await;
    assert_eq!(record["stdout"], "idle /tmp\n", "{record}");
    assert_eq!(record["resumed"], true);

    let (status, closing) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "bash", "idle_timeout_s": 1, "idle_action": "close"}),
        )
        .await;
    assert_eq!(status, 201, "{closing}");
    let closed = status_becomes(&gw, &agent, closing["id"].as_str().unwrap(), "closed").await;
    assert_eq!(closed["closed_reason"], "idle", "{closed}");
    gw.stop().await;
}

/// An execution that arrives while an idle pause is checkpointing the session (its row still
/// says `ready`) waits for the pause and resumes the session; it used to be answered 409
/// "busy". With a 1 s idle timeout the pause starts 1 s after the last cell and its checkpoint
/// takes longer than the 0.3 s after that at which the next cell arrives.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_arriving_during_an_idle_pause_waits_and_resumes_instead_of_busy() {
    let daemon = shared_daemon().await;
    let gw = gateway_on(&daemon).await;
    let agent = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "bash", "idle_timeout_s": 1}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sessions/{id}/executions");
    let mut resumed = 0;
    for round in 0..3 {
        let (status, record) = gw
            .post(
                &agent,
                &path,
                &json!({"code": format!("R{round}=x; echo $R0")}),
            )
            .await;
        assert_eq!(status, 200, "round {round}: {record}");
        assert_eq!(record["stdout"], "x\n", "round {round}: {record}");
        if record["resumed"] == true {
            resumed += 1;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    }
    // At least one cell met a pause (else this test measured nothing).
    assert!(resumed >= 1, "no cell arrived during or after a pause");
    gw.stop().await;
}
