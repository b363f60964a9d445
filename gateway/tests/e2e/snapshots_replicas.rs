//! Snapshots through two replicas (issue 24 item 7; docs/snapshots.md "Replicas"): two real
//! `sandgate serve` processes on one PostgreSQL and the private experimental dockerd
//! (`snapshots::shared_daemon`), with one `snapshots.dir`. A session paused on one replica is
//! resumed through the other, which restores it and becomes its owner (claimed in PostgreSQL);
//! pause and snapshot of a session running on the other replica are relayed to it; a paused
//! session outlives its replica's lease while that replica lives; and the paused sessions of a
//! killed replica are adopted by the survivor, which resumes them, instead of being closed.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use crate::replicas::harness::{Replica, Shared, LEASE_MS};
use crate::snapshots::shared_daemon;

const SETUP: &str = "\
import os
x = 41
os.makedirs('/workspace/d', exist_ok=True)
os.chdir('/workspace/d')
open('f.txt', 'w').write('kept')";

const READ: &str = "(x + 1, os.getcwd(), open('f.txt').read())";
const STATE: &str = "(42, '/workspace/d', 'kept')";

/// Two replicas' settings: the private daemon, snapshots on in one shared directory.
fn settings(socket: &str, dir: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("DOCKER_HOST", socket.to_owned()),
        (
            "SANDGATE_SNAPSHOTS",
            format!("{{enabled: true, dir: {}}}", dir.display()),
        ),
    ]
}

async fn start(shared: &Shared, data: Option<&std::path::Path>, env: &[(&str, String)]) -> Replica {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    shared.start_with(data, &env).await
}

async fn open(shared: &Shared, at: &Replica, agent: &str) -> String {
    let body = json!({"language": "python"});
    let (status, session) = shared.post(at, agent, "/v1/sessions", &body).await;
    assert_eq!(status, 201, "{session}");
    session["id"].as_str().unwrap().to_owned()
}

async fn run(shared: &Shared, at: &Replica, agent: &str, id: &str, code: &str) -> Value {
    let path = format!("/v1/sessions/{id}/executions");
    let (status, record) = shared.post(at, agent, &path, &json!({"code": code})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    record
}

async fn step(shared: &Shared, at: &Replica, agent: &str, id: &str, what: &str) -> Value {
    let path = format!("/v1/sessions/{id}/{what}");
    let (status, answer) = shared.post(at, agent, &path, &json!({})).await;
    assert!(status == 200 || status == 201, "{what}: {status} {answer}");
    answer
}

async fn session_row(pool: &sqlx::PgPool, id: &str) -> (String, String) {
    sqlx::query_as("SELECT status, instance FROM sessions WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn resumed_events(pool: &sqlx::PgPool, id: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT decision FROM audit_events WHERE kind = 'session.resumed' \
         AND input->>'session_id' = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn lease() -> Duration {
    Duration::from_millis(LEASE_MS.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_paused_on_one_replica_resumes_on_the_other_with_its_state() {
    let daemon = shared_daemon().await;
    let shared = Shared::new().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("unix://{}", daemon.socket().display());
    let env = settings(&socket, dir.path());
    let a = start(&shared, None, &env).await;
    let b = start(&shared, None, &env).await;
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let agent = shared.key("agent", "acme").await;
    let id = open(&shared, &a, &agent).await;
    run(&shared, &a, &agent, &id, SETUP).await;

    // A pause sent to B is relayed to A, whose sandbox it checkpoints.
    let paused = step(&shared, &b, &agent, &id, "pause").await;
    assert_eq!(paused["status"], "paused", "{paused}");
    assert!(daemon.containers_of(&a.instance).is_empty());
    // Paused, it holds no sandbox, yet A keeps renewing it: B does not close it.
    tokio::time::sleep(lease() * 3).await;
    assert_eq!(
        session_row(&pool, &id).await,
        ("paused".into(), a.instance.clone())
    );

    // B restores it itself and owns it from then on.
    let resumed = step(&shared, &b, &agent, &id, "resume").await;
    assert_eq!(resumed["status"], "ready", "{resumed}");
    assert_eq!(
        session_row(&pool, &id).await,
        ("ready".into(), b.instance.clone())
    );
    assert_eq!(daemon.containers_of(&b.instance).len(), 1);
    assert!(daemon.containers_of(&a.instance).is_empty());
    let said = resumed_events(&pool, &id).await;
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["replica"], b.instance.as_str(), "{said:?}");
    assert_eq!(said[0]["paused_on"], a.instance.as_str(), "{said:?}");
    // Sent to A, an execution is relayed to B, where the state is intact.
    let read = run(&shared, &a, &agent, &id, READ).await;
    assert_eq!(read["result"], STATE, "{read}");

    // A snapshot asked of A is taken by B, which runs the sandbox.
    let path = format!("/v1/sessions/{id}/snapshots");
    let (status, snapshot) = shared.post(&a, &agent, &path, &json!({})).await;
    assert_eq!(status, 201, "{snapshot}");
    assert!(
        snapshot["id"].as_str().unwrap().starts_with("sn_"),
        "{snapshot}"
    );
    assert_eq!(snapshot["session_id"], id.as_str(), "{snapshot}");

    // Paused on B, an execution sent to A restores it on A.
    step(&shared, &b, &agent, &id, "pause").await;
    let read = run(&shared, &a, &agent, &id, READ).await;
    assert_eq!(read["result"], STATE, "{read}");
    assert_eq!(read["resumed"], true, "{read}");
    assert_eq!(
        session_row(&pool, &id).await,
        ("ready".into(), a.instance.clone())
    );
    assert_eq!(daemon.containers_of(&a.instance).len(), 1);
    assert!(daemon.containers_of(&b.instance).is_empty());

    let (status, closed) = shared
        .delete(&b, &agent, &format!("/v1/sessions/{id}"))
        .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["status"], "closed", "{closed}");
    common::until(Duration::from_secs(20), "the sandbox removed", || async {
        daemon.containers_of(&a.instance).is_empty().then_some(())
    })
    .await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_replicas_paused_session_is_adopted_and_resumed_by_the_survivor() {
    let daemon = shared_daemon().await;
    let shared = Shared::new().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("unix://{}", daemon.socket().display());
    let env = settings(&socket, dir.path());
    let mut a = start(&shared, None, &env).await;
    let b = start(&shared, None, &env).await;
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let agent = shared.key("agent", "acme").await;
    let id = open(&shared, &a, &agent).await;
    run(&shared, &a, &agent, &id, SETUP).await;
    step(&shared, &a, &agent, &id, "pause").await;
    a.kill();

    // Once A's lease expired, B serves the session: still paused, now B's.
    let dead = a.instance.clone();
    let adopted = common::until(Duration::from_secs(30), "B adopts the session", || {
        let (pool, id, dead) = (&pool, &id, &dead);
        async move {
            let row = session_row(pool, id).await;
            (&row.1 != dead).then_some(row)
        }
    })
    .await;
    assert_eq!(adopted, ("paused".into(), b.instance.clone()));
    let read = run(&shared, &b, &agent, &id, READ).await;
    assert_eq!(read["result"], STATE, "{read}");
    assert_eq!(read["resumed"], true, "{read}");
    assert_eq!(daemon.containers_of(&b.instance).len(), 1);

    // A comes back (same instance): the session stays B's and open.
    let data = a.data.clone();
    let a = start(&shared, Some(&data), &env).await;
    tokio::time::sleep(lease() * 2).await;
    assert_eq!(
        session_row(&pool, &id).await,
        ("ready".into(), b.instance.clone())
    );
    let read = run(&shared, &a, &agent, &id, READ).await;
    assert_eq!(read["result"], STATE, "{read}");
    let (status, closed) = shared
        .delete(&a, &agent, &format!("/v1/sessions/{id}"))
        .await;
    assert_eq!(status, 200, "{closed}");
    a.stop().await;
    b.stop().await;
}

/// On A: a code-interpreter sandbox with state; prints its id.
const E2B_ON_A: &str = r#"
import json
from e2b_code_interpreter import Sandbox
sbx = Sandbox.create(timeout=300)
sbx.run_code("x = 41")
sbx.commands.run("echo kept > /home/user/state.txt")
print(json.dumps({"id": sbx.sandbox_id}))
"#;

/// On B: pause (relayed to A), connect (restored on B), state read, a snapshot, kill.
const E2B_ON_B: &str = r#"
import json, os
from e2b_code_interpreter import Sandbox
sid = os.environ["SANDBOX_ID"]
out = {"paused": Sandbox.pause(sid)}
out["state"] = Sandbox.get_info(sid).state.value
sbx = Sandbox.connect(sid)
out["x"] = sbx.run_code("x + 1").text
out["file"] = sbx.commands.run("cat /home/user/state.txt").stdout
out["snapshot"] = sbx.create_snapshot().snapshot_id
sbx.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_e2b_sdks_pause_and_connect_work_through_either_replica() {
    let daemon = shared_daemon().await;
    let shared = Shared::new().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("unix://{}", daemon.socket().display());
    let env = settings(&socket, dir.path());
    let a = start(&shared, None, &env).await;
    let b = start(&shared, None, &env).await;
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    let agent = shared.key("agent", "acme").await;
    let made = common::e2b_agent(E2B_ON_A, &a.url, &agent, &[]).await;
    let id = made["id"].as_str().unwrap().to_owned();
    let said = common::e2b_agent(E2B_ON_B, &b.url, &agent, &[("SANDBOX_ID", id.as_str())]).await;
    assert_eq!(said["paused"], true, "{said}");
    assert_eq!(said["state"], "paused", "{said}");
    assert_eq!(said["x"], "42", "{said}");
    assert_eq!(said["file"], "kept\n", "{said}");
    assert!(
        said["snapshot"].as_str().unwrap().starts_with("sn_"),
        "{said}"
    );
    let said = resumed_events(&pool, &id).await;
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["replica"], b.instance.as_str(), "{said:?}");
    assert_eq!(said[0]["paused_on"], a.instance.as_str(), "{said:?}");
    a.stop().await;
    b.stop().await;
}
