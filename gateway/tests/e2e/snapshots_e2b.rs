//! E2B's pause, resume (connect) and snapshot calls on sandgate's snapshots (issue 24 item 6,
//! docs/e2b.md), driven by E2B's own Python SDK (pinned in scripts/setup.sh) against a gateway
//! on the private experimental dockerd (`snapshots::shared_daemon`): `sbx.pause()` checkpoints
//! the session (state `paused` in info and list, no container), `Sandbox.connect(id)` restores
//! it with its files and variables, `create_snapshot()` keeps a snapshot whose id, given to
//! `Sandbox.create`, forks a new sandbox from it.

use crate::common;

use common::TestGateway;
use serde_json::Value;

use crate::snapshots::{events, gateway_with, shared_daemon};

const AGENT: &str = r#"
import json
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox as CodeInterpreter
out = {}
sbx = Sandbox.create(template="base", timeout=120)
out["id"] = sbx.sandbox_id
sbx.commands.run("echo kept > /tmp/state.txt")
out["paused"] = sbx.pause()
out["paused_again"] = Sandbox.pause(sbx.sandbox_id)
out["info_state"] = Sandbox.get_info(sbx.sandbox_id).state.value
paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
out["listed_paused"] = [s.sandbox_id for s in paused]
running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
out["listed_running"] = [s.sandbox_id for s in running]
back = Sandbox.connect(sbx.sandbox_id)
out["after"] = back.commands.run("cat /tmp/state.txt").stdout
out["state_after"] = back.get_info().state.value

ci = CodeInterpreter.create()
ci.run_code("x = 41")
snap = ci.create_snapshot()
out["snapshot"] = snap.snapshot_id
fork = CodeInterpreter.create(template=snap.snapshot_id)
out["fork"] = fork.run_code("x + 1").text
out["parent_goes_on"] = ci.run_code("x + 2").text
ci.pause()
again = CodeInterpreter.connect(ci.sandbox_id)
out["ci_resumed"] = again.run_code("x + 3").text
for s in (back, fork, again):
    s.kill()
print(json.dumps(out))
"#;

async fn run_agent(gw: &TestGateway, agent: &str) -> Value {
    common::e2b_agent(AGENT, &gw.url, agent, &[]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_e2b_sdks_pause_connect_and_snapshot_are_sandgates() {
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let gw = gateway_with(&daemon, url, tempfile::tempdir().unwrap(), |config| {
        config.max_sessions = 6;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let said = run_agent(&gw, &agent).await;
    let id = said["id"].as_str().unwrap();
    assert_eq!(said["paused"], true, "{said}");
    assert_eq!(said["paused_again"], false, "already paused: {said}");
    assert_eq!(said["info_state"], "paused", "{said}");
    assert!(
        said["listed_paused"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == id),
        "{said}"
    );
    assert!(
        !said["listed_running"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == id),
        "{said}"
    );
    assert_eq!(said["after"], "kept\n", "{said}");
    assert_eq!(said["state_after"], "running", "{said}");
    assert!(
        said["snapshot"].as_str().unwrap().starts_with("sn_"),
        "{said}"
    );
    assert_eq!(said["fork"], "42", "{said}");
    assert_eq!(said["parent_goes_on"], "43", "{said}");
    assert_eq!(said["ci_resumed"], "44", "{said}");
    // sandgate's own lineage: the pause and the resume of the first sandbox's session.
    assert_eq!(events(&gw, "session.paused", id).await.len(), 1);
    assert_eq!(events(&gw, "session.resumed", id).await.len(), 1);
    gw.stop().await;
}
