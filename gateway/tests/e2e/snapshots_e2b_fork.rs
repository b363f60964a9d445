//! E2B's fork (`sbx.fork(count=N)`, `POST /sandboxes/{id}/fork`) on sandgate's snapshots,
//! driven by E2B's own Python SDK (pinned in scripts/setup.sh) against a gateway on the private
//! experimental dockerd (`snapshots::shared_daemon`): the parent is snapshotted once and goes
//! on; each fork is a new sandbox restored from that snapshot, decided afresh by the policy
//! (`session.created` naming the snapshot, one per fork), sharing nothing writable with its
//! sibling or parent; a fork past `max_sessions` fails alone (the SDK's `RateLimitException`
//! in its place in the list); the snapshot is deleted once the forks started.

use crate::common;

use serde_json::Value;

use crate::snapshots::{gateway_with, shared_daemon};

const AGENT: &str = r#"
import json
from e2b_code_interpreter import Sandbox
out = {}
parent = Sandbox.create(timeout=120)
out["parent_id"] = parent.sandbox_id
parent.run_code("x = 41")
parent.commands.run("echo kept > /home/user/state.txt")
forks = parent.fork(count=3, timeout=120)
out["kinds"] = [type(f).__name__ for f in forks]
ok = [f for f in forks if isinstance(f, Sandbox)]
out["errors"] = [str(f) for f in forks if not isinstance(f, Sandbox)]
out["ids"] = [f.sandbox_id for f in ok]
out["values"] = [f.run_code("x + 1").text for f in ok]
out["files"] = [f.commands.run("cat /home/user/state.txt").stdout for f in ok]
ok[0].run_code("x = 100")
ok[0].commands.run("echo changed > /home/user/state.txt")
out["sibling"] = ok[1].run_code("x").text
out["sibling_file"] = ok[1].commands.run("cat /home/user/state.txt").stdout
out["parent"] = parent.run_code("x").text
out["parent_file"] = parent.commands.run("cat /home/user/state.txt").stdout
for s in ok + [parent]:
    s.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_e2b_sdks_fork_starts_each_fork_from_one_snapshot_decided_afresh() {
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let gw = gateway_with(&daemon, url, tempfile::tempdir().unwrap(), |config| {
        // The parent and two forks: the third fork is refused on its own.
        config.max_sessions = 3;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let said: Value = common::e2b_agent(AGENT, &gw.url, &agent, &[]).await;
    assert_eq!(
        said["kinds"],
        serde_json::json!(["Sandbox", "Sandbox", "RateLimitException"]),
        "{said}"
    );
    assert!(
        said["errors"][0].as_str().unwrap().contains("max_sessions")
            || said["errors"][0]
                .as_str()
                .unwrap()
                .contains("open sessions"),
        "{said}"
    );
    assert_eq!(said["values"], serde_json::json!(["42", "42"]), "{said}");
    assert_eq!(
        said["files"],
        serde_json::json!(["kept\n", "kept\n"]),
        "{said}"
    );
    assert_eq!(said["sibling"], "41", "{said}");
    assert_eq!(said["sibling_file"], "kept\n", "{said}");
    assert_eq!(said["parent"], "41", "{said}");
    assert_eq!(said["parent_file"], "kept\n", "{said}");

    // One snapshot, of the parent; each started fork decided with it; then deleted.
    let pool = gw.pool().await;
    let parent = said["parent_id"].as_str().unwrap();
    let snapshots: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("SELECT id, deleted_at FROM snapshots WHERE session_id = $1")
            .bind(parent)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert!(snapshots[0].1.is_some(), "deleted once the forks started");
    for fork in said["ids"].as_array().unwrap() {
        let decided: Value = sqlx::query_scalar(
            "SELECT input FROM audit_events WHERE kind = 'session.created' \
             AND input->>'session_id' = $1",
        )
        .bind(fork.as_str().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
        let from = &decided["request"]["request"]["from_snapshot"];
        assert_eq!(from["id"], snapshots[0].0.as_str(), "{decided}");
        assert_eq!(from["session_id"], parent, "{decided}");
    }
    gw.stop().await;
}
