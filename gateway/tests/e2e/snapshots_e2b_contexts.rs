//! A snapshot (here E2B's fork) of a sandbox with code contexts (docs/e2b.md): as a pause, the
//! contexts other than the default one end before the checkpoint; they answer "ended" until
//! restarted, and the default context's state goes on.

use crate::common;

use serde_json::Value;

use crate::snapshots::{gateway_with, shared_daemon};

const AGENT: &str = r#"
import json
from e2b_code_interpreter import Sandbox

def err(f):
    try:
        f()
        return "no error"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)

out = {}
parent = Sandbox.create(timeout=120)
a = parent.create_code_context()
parent.run_code("y = 7", context=a)
parent.run_code("x = 41")
forks = parent.fork(count=1, timeout=120)
out["forked"] = [type(f).__name__ for f in forks]
out["after"] = err(lambda: parent.run_code("y", context=a))
out["default"] = parent.run_code("x + 1").text
parent.restart_code_context(a)
out["restarted"] = parent.run_code("z = 3; z", context=a).text
for s in forks + [parent]:
    s.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_ends_the_code_contexts_until_restarted() {
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let gw = gateway_with(&daemon, url, tempfile::tempdir().unwrap(), |_| {}).await;
    let agent = gw.key("agent", "acme").await;
    let said: Value = common::e2b_agent(AGENT, &gw.url, &agent, &[]).await;
    assert_eq!(said["forked"], serde_json::json!(["Sandbox"]), "{said}");
    let after = said["after"].as_str().unwrap();
    assert!(
        after.contains("ended") && after.contains("snapshotted"),
        "{said}"
    );
    assert_eq!(said["default"], "42", "{said}");
    assert_eq!(said["restarted"], "3", "{said}");
}
