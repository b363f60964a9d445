//! E2B's directory watchers (`files.watch_dir`: `filesystem.Filesystem/CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`) driven by E2B's own Python SDK through the real stack
//! (dockerd, runsc, PostgreSQL): create, write, rename and remove seen in order, a recursive
//! watch seeing a directory made after it started, a path outside the writable places and a
//! symlink to outside refused, more than the 1024 events a watcher keeps said rather than cut
//! silently, at most 8 watchers (a ninth refused), `stop()` ending the
//! watcher in the sandbox; and the streamed `WatchDir` (the JS SDK's form, driven through the
//! Python SDK's own Connect client) ending with its sandbox.

use crate::common;

use common::TestGateway;

const AGENT: &str = r#"
import json, threading, time
from e2b import Sandbox
from e2b.envd.filesystem import filesystem_pb
from e2b.sandbox.filesystem.watch_handle import map_event_type

out = {}
sbx = Sandbox.create(template="base", timeout=180)
out["id"] = sbx.sandbox_id

def seen(handle):
    return [[e.type.value, e.name] for e in handle.get_new_events()]

def watchers_running():
    r = sbx.commands.run("ps -eo args | grep -c '^/sandgate/init watch' || true")
    return int(r.stdout.strip())

sbx.files.make_dir("w/sub")
flat = sbx.files.watch_dir("w")
sbx.files.write("w/a.txt", "one")
sbx.files.rename("w/a.txt", "w/b.txt")
sbx.files.remove("w/b.txt")
out["flat"] = seen(flat)
sbx.files.write("w/sub/deep.txt", "x")
out["flat_below"] = seen(flat)
out["flat_again"] = seen(flat)
flat.stop()

deep = sbx.files.watch_dir("w", recursive=True)
sbx.files.make_dir("w/new")
sbx.files.write("w/new/n.txt", "n")
sbx.files.write("w/sub/deep2.txt", "y")
out["recursive"] = seen(deep)
deep.stop()

# Past the 1024 events a watcher keeps between two reads: said, not silently cut.
sbx.files.make_dir("many")
many = sbx.files.watch_dir("many")
sbx.commands.run("cd /home/user/many && for i in $(seq 1100); do : > f$i; done")
try:
    out["overflow"] = "%d events" % len(many.get_new_events())
except Exception as e:
    out["overflow"] = type(e).__name__ + ": " + str(e)
sbx.files.write("many/after.txt", "a")
out["after_overflow"] = seen(many)
many.stop()

def refusal(path):
    try:
        sbx.files.watch_dir(path)
        return "watching"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)

out["outside"] = refusal("/etc")
out["traversal"] = refusal("w/../../../etc")
sbx.commands.run("ln -s /etc /home/user/w/link")
out["symlink"] = refusal("w/link")
out["below_symlink"] = refusal("/home/user/w/link/ssl")

handles = [sbx.files.watch_dir("w") for _ in range(8)]
out["running_8"] = watchers_running()
out["ninth"] = refusal("w")
handles[0].stop()
handles[0] = sbx.files.watch_dir("w")
out["after_one_stopped"] = "watching"
for h in handles:
    h.stop()
time.sleep(0.5)
out["running_after_stop"] = watchers_running()

# The streamed form (WatchDir, what the JS SDK uses), through the SDK's own Connect client.
sbx.files.make_dir("s")
stream = sbx.files._rpc.watch_dir(filesystem_pb.WatchDirRequest(path="/home/user/s"),
                                  timeout_ms=60000)
out["stream_first"] = next(stream).event.field
streamed = []
def reader():
    try:
        for r in stream:
            if r.event is not None and r.event.field == "filesystem":
                streamed.append([map_event_type(r.event.value.type).value, r.event.value.name])
        streamed.append(["ended", "cleanly"])
    except Exception as e:
        streamed.append(["ended", type(e).__name__ + ": " + str(e)])
thread = threading.Thread(target=reader, daemon=True)
thread.start()
sbx.files.write("s/x.txt", "x")
for _ in range(100):
    if ["create", "x.txt"] in streamed:
        break
    time.sleep(0.05)
out["streamed"] = list(streamed)
sbx.kill()
thread.join(15)
out["stream_end"] = streamed[-1] if streamed else None
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn watchers_see_changes_in_order_and_are_confined_and_bounded() {
    common::require_docker();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), |config| {
        config.max_sessions = 2;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let said = common::e2b_agent(AGENT, &gw.url, &agent, &[]).await;

    let flat: Vec<(String, String)> = serde_json::from_value(said["flat"].clone()).unwrap();
    let in_order = [
        ("create", "a.txt"),
        ("write", "a.txt"),
        ("rename", "a.txt"),
        ("create", "b.txt"),
        ("remove", "b.txt"),
    ];
    let mut at = 0;
    for wanted in in_order {
        let found = flat[at..]
            .iter()
            .position(|(kind, name)| (kind.as_str(), name.as_str()) == wanted);
        let found = found.unwrap_or_else(|| panic!("{wanted:?} after #{at} in {flat:?}"));
        at += found + 1;
    }
    assert_eq!(
        said["flat_below"],
        serde_json::json!([]),
        "not recursive: a change below is not seen: {said}"
    );
    assert_eq!(said["flat_again"], serde_json::json!([]), "each event once");

    let deep: Vec<(String, String)> = serde_json::from_value(said["recursive"].clone()).unwrap();
    for wanted in [
        ("create", "new"),
        ("create", "new/n.txt"),
        ("create", "sub/deep2.txt"),
        ("write", "sub/deep2.txt"),
    ] {
        assert!(
            deep.iter()
                .any(|(kind, name)| (kind.as_str(), name.as_str()) == wanted),
            "{wanted:?} in {deep:?}"
        );
    }

    let overflow = said["overflow"].as_str().unwrap();
    assert!(
        overflow.contains("lost events") && overflow.contains("past the 1024"),
        "{overflow}"
    );
    let after: Vec<(String, String)> =
        serde_json::from_value(said["after_overflow"].clone()).unwrap();
    assert_eq!(
        after.first(),
        Some(&("create".to_owned(), "after.txt".to_owned())),
        "the read after the loss has what followed it"
    );

    for name in ["outside", "traversal"] {
        let refused = said[name].as_str().unwrap();
        assert!(
            refused.contains("permission_denied") || refused.contains("PERMISSION_DENIED"),
            "{name}: {refused}"
        );
        assert!(refused.contains("writable places"), "{name}: {refused}");
    }
    for name in ["symlink", "below_symlink"] {
        let refused = said[name].as_str().unwrap();
        assert!(refused.contains("symlink"), "{name}: {refused}");
        assert!(
            refused.contains("permission_denied") || refused.contains("PERMISSION_DENIED"),
            "{name}: {refused}"
        );
    }

    assert_eq!(said["running_8"], 8, "each watcher runs in the sandbox");
    let ninth = said["ninth"].as_str().unwrap();
    assert!(ninth.contains("already has 8 watchers"), "{ninth}");
    assert_eq!(said["after_one_stopped"], "watching");
    assert_eq!(
        said["running_after_stop"], 0,
        "stop() ends the watcher in the sandbox"
    );
    assert_eq!(said["stream_first"], "start", "{said}");
    let streamed = said["streamed"].as_array().unwrap();
    assert!(
        streamed.contains(&serde_json::json!(["create", "x.txt"])),
        "WatchDir streams the events as they happen: {said}"
    );
    let end = said["stream_end"].to_string();
    assert!(
        end.contains("ended") && end.contains("paused, killed or closed"),
        "the stream ends with its sandbox, saying so: {end}"
    );
    gw.stop().await;
}
