//! The E2B-compatible API's files and code interpreter (`/e2b`: envd's `filesystem.Filesystem`
//! and `/files`, the interpreter's `/execute`; docs/e2b.md) driven by E2B's own Python SDKs
//! (`e2b` and `e2b-code-interpreter` from PyPI, pinned in scripts/setup.sh) with only
//! `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` pointed here. Real dockerd, runsc,
//! PostgreSQL behind it: every file operation a session file operation of the sandbox's init
//! (writes, moves, removals audited), every `run_code` a recorded session execution.

use crate::common;

use common::TestGateway;
use serde_json::Value;

/// A policy bundle that also denies one cell (by its code's SHA-256) through run_code.
const DENY_CELL: &str = r#"package sandgate.execution

deny contains {"code": "e2b.cell_refused", "message": "this cell is refused by policy"} if {
	input.request.kind == "session_execution"
	input.request.e2b.call == "run_code"
	input.request.code_sha256 == "CELL_SHA"
}
"#;

/// The cell [`DENY_CELL`] refuses.
const DENIED_CELL: &str = "denied_cell = 1";

/// What the agent platform does with the SDKs. Prints one JSON line with what it saw.
const AGENT: &str = r#"
import json, os, hashlib
from e2b import SandboxException, FileNotFoundException
from e2b_code_interpreter import Sandbox

def attempt(fn):
    try:
        fn()
        return "allowed"
    except FileNotFoundException as e:
        return "FileNotFoundException: " + str(e)
    except SandboxException as e:
        return type(e).__name__ + ": " + str(e)

out = {}
sbx = Sandbox.create(timeout=180)
out["id"] = sbx.sandbox_id
f = sbx.files

w = f.write("/workspace/hello.txt", "hello e2b")
out["write"] = {"name": w.name, "path": w.path, "type": str(w.type)}
out["read"] = f.read("/workspace/hello.txt")
blob = bytes(range(256)) * 16
f.write("/workspace/bin/blob.bin", blob)
out["binary_same"] = bytes(f.read("/workspace/bin/blob.bin", format="bytes")) == blob
big = os.urandom(8 * 1024 * 1024)
f.write("/tmp/big.bin", big)
out["big_same"] = bytes(f.read("/tmp/big.bin", format="bytes")) == big
out["too_big"] = attempt(lambda: f.write("/tmp/huge.bin", b"\0" * (17 * 1024 * 1024)))
several = f.write_files([{"path": "/workspace/m/a.txt", "data": "A"}, {"path": "/workspace/m/n/b.txt", "data": b"B"}])
out["several"] = sorted(x.path for x in several)
out["made"] = f.make_dir("/workspace/d/e")
out["made_again"] = f.make_dir("/workspace/d/e")
out["list"] = sorted(e.name for e in f.list("/workspace"))
out["list_depth2"] = sorted(e.path for e in f.list("/workspace/m", depth=2))
out["types"] = {e.name: e.type.value for e in f.list("/workspace")}
out["size"] = f.get_info("/workspace/bin/blob.bin").size
out["renamed"] = f.rename("/workspace/hello.txt", "/workspace/d/hello2.txt").path
out["exists_old"] = f.exists("/workspace/hello.txt")
out["exists_new"] = f.exists("/workspace/d/hello2.txt")
f.remove("/workspace/d")
out["exists_removed"] = f.exists("/workspace/d/hello2.txt")
out["missing"] = attempt(lambda: f.read("/workspace/nope.txt"))

out["read_dotdot"] = attempt(lambda: f.read("/workspace/../../etc/passwd"))
out["read_relative_dotdot"] = attempt(lambda: f.read("../../etc/passwd"))
out["read_etc"] = attempt(lambda: f.read("/etc/passwd"))
out["write_etc"] = attempt(lambda: f.write("/etc/evil", "x"))
out["list_etc"] = attempt(lambda: f.list("/etc"))
out["remove_etc"] = attempt(lambda: f.remove("/etc/passwd"))
out["move_out"] = attempt(lambda: f.rename("/workspace/bin/blob.bin", "/etc/blob.bin"))
sbx.commands.run("ln -s /etc /workspace/link; ln -s /etc/passwd /workspace/pw")
out["read_through_link"] = attempt(lambda: f.read("/workspace/link/passwd"))
out["read_link"] = attempt(lambda: f.read("/workspace/pw"))
out["write_through_link"] = attempt(lambda: f.write("/workspace/link/evil", "x"))
out["list_through_link"] = attempt(lambda: f.list("/workspace/link"))
out["watch"] = attempt(lambda: f.watch_dir("/workspace/link"))

sbx.run_code("x = 1")
out["x_plus_1"] = sbx.run_code("x + 1").text
seen = {"stdout": [], "stderr": []}
ex = sbx.run_code(
    "import sys\nprint('out line')\nprint('err line', file=sys.stderr)",
    on_stdout=lambda m: seen["stdout"].append(m.line),
    on_stderr=lambda m: seen["stderr"].append(m.line),
)
out["logs"] = {"stdout": ex.logs.stdout, "stderr": ex.logs.stderr}
out["callbacks"] = seen
import time
arrived = []
ex = sbx.run_code(
    "import time\nprint('early', flush=True)\ntime.sleep(2)\nprint('late')",
    on_stdout=lambda m: arrived.append((m.line, time.monotonic())),
)
done = time.monotonic()
out["live"] = {"lines": [a[0] for a in arrived], "early_before_end_s": done - arrived[0][1]}
ex = sbx.run_code("1/0")
out["error"] = {"name": ex.error.name, "value": ex.error.value, "in_traceback": "1/0" in ex.error.traceback}
ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
out["plots"] = [(r.png or "")[:11] for r in ex.results]
ex = sbx.run_code("echo bash-$((1+2))", language="bash")
out["bash"] = ex.logs.stdout
out["count"] = ex.execution_count
out["denied_cell"] = attempt(lambda: sbx.run_code("denied_cell = 1"))
out["r_cell"] = attempt(lambda: sbx.run_code("1", language="r"))
out["contexts"] = attempt(lambda: sbx.create_code_context())
sbx.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_e2b_sdks_use_files_and_run_code_in_sandgate_sessions() {
    common::require_docker();
    let policies = common::copy_of_shipped();
    let rule = DENY_CELL.replace("CELL_SHA", &sha256_hex(DENIED_CELL.as_bytes()));
    std::fs::write(policies.path().join("e2b_cell.rego"), rule).unwrap();
    let policy_dir = policies.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
        config.max_sessions = 4;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let said = run_agent(&gw.url, &agent).await;
    let id = said["id"].as_str().unwrap().to_owned();

    assert_eq!(said["write"]["path"], "/workspace/hello.txt", "{said}");
    assert_eq!(said["write"]["name"], "hello.txt");
    assert_eq!(said["read"], "hello e2b");
    assert_eq!(said["binary_same"], true);
    assert_eq!(said["big_same"], true, "an 8 MiB upload round trip");
    let too_big = said["too_big"].as_str().unwrap();
    assert!(too_big.contains("413"), "{too_big}");
    assert_eq!(
        said["several"],
        serde_json::json!(["/workspace/m/a.txt", "/workspace/m/n/b.txt"]),
        "one multipart upload of several files, parents made"
    );
    assert_eq!(said["made"], true);
    assert_eq!(said["made_again"], false);
    assert_eq!(
        said["list"],
        serde_json::json!(["bin", "d", "hello.txt", "m"])
    );
    assert_eq!(
        said["list_depth2"],
        serde_json::json!([
            "/workspace/m/a.txt",
            "/workspace/m/n",
            "/workspace/m/n/b.txt"
        ])
    );
    assert_eq!(said["types"]["bin"], "dir");
    assert_eq!(said["types"]["hello.txt"], "file");
    assert_eq!(said["size"], 4096);
    assert_eq!(said["renamed"], "/workspace/d/hello2.txt");
    assert_eq!(said["exists_old"], false);
    assert_eq!(said["exists_new"], true);
    assert_eq!(said["exists_removed"], false);
    let missing = said["missing"].as_str().unwrap();
    assert!(missing.starts_with("FileNotFoundException"), "{missing}");

    for attempt in [
        "read_dotdot",
        "read_relative_dotdot",
        "read_etc",
        "write_etc",
        "list_etc",
        "remove_etc",
        "move_out",
    ] {
        let refused = said[attempt].as_str().unwrap();
        assert!(
            refused.starts_with("SandboxException") && refused.contains("writable places"),
            "{attempt}: {refused}"
        );
    }
    for attempt in [
        "read_through_link",
        "read_link",
        "write_through_link",
        "list_through_link",
    ] {
        let refused = said[attempt].as_str().unwrap();
        assert!(
            (refused.starts_with("SandboxException: 403: ")
                || refused.starts_with("SandboxException: Code.PERMISSION_DENIED: "))
                && (refused.contains("symlink") || refused.contains("symbolic link")),
            "{attempt}: {refused}"
        );
    }
    let watch = said["watch"].as_str().unwrap();
    // Watching is supported (e2b_watch.rs); through a planted symlink it is refused too.
    assert!(
        watch.contains("PERMISSION_DENIED") && watch.contains("symlink"),
        "{watch}"
    );

    assert_eq!(said["x_plus_1"], "2", "state carries from cell to cell");
    assert_eq!(said["logs"]["stdout"], serde_json::json!(["out line\n"]));
    assert_eq!(said["logs"]["stderr"], serde_json::json!(["err line\n"]));
    assert_eq!(
        said["callbacks"], said["logs"],
        "on_stdout and on_stderr ran"
    );
    assert_eq!(
        said["live"]["lines"],
        serde_json::json!(["early\n", "late\n"])
    );
    let early = said["live"]["early_before_end_s"].as_f64().unwrap();
    assert!(
        early > 1.5,
        "stdout is streamed as the cell writes it: {early} s before the end"
    );
    assert_eq!(said["error"]["name"], "ZeroDivisionError");
    assert_eq!(said["error"]["value"], "division by zero");
    assert_eq!(said["error"]["in_traceback"], true);
    assert_eq!(
        said["plots"],
        serde_json::json!(["iVBORw0KGgo"]),
        "the figure's PNG"
    );
    assert_eq!(said["bash"], serde_json::json!(["bash-3\n"]));
    assert_eq!(said["count"], 8);
    let denied = said["denied_cell"].as_str().unwrap();
    assert!(
        denied.starts_with("SandboxException: 403")
            && denied.contains("this cell is refused by policy"),
        "{denied}"
    );
    let r_cell = said["r_cell"].as_str().unwrap();
    assert!(r_cell.contains("not supported"), "{r_cell}");
    // Code contexts are served now (e2b_contexts.rs tests them).
    assert_eq!(said["contexts"], "allowed");

    audited(&gw, &id).await;
    gw.stop().await;
}

/// A write is audited with its bytes' SHA-256, moves and removals too; every cell is a
/// session execution decided with `request.e2b.call: "run_code"`.
async fn audited(gw: &TestGateway, id: &str) {
    let pool = gw.pool().await;
    let written: (i64, String) = sqlx::query_as(
        "SELECT (input ->> 'bytes')::bigint, input ->> 'sha256' FROM audit_events \
         WHERE kind = 'session.file_written' AND input ->> 'session_id' = $1 \
         AND input ->> 'path' = '/workspace/hello.txt'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(written.0, 9);
    assert_eq!(written.1, sha256_hex(b"hello e2b"));
    for kind in ["session.file_moved", "session.file_removed"] {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_events WHERE kind = $1 AND input ->> 'session_id' = $2",
        )
        .bind(kind)
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(n >= 1, "{kind}");
    }
    let cells: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events a JOIN executions e ON e.id = a.execution_id \
         WHERE e.session_id = $1 AND a.kind = 'execution.decision' \
         AND a.input -> 'request' -> 'e2b' ->> 'call' = 'run_code'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(cells, 8, "each run_code's decision names the SDK call");
    let results: Value = sqlx::query_scalar(
        "SELECT to_jsonb(results) FROM executions WHERE session_id = $1 AND results IS NOT NULL \
         ORDER BY created_at LIMIT 1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(results["results"][0]["text"], "2", "{results}");
    pool.close().await;
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

async fn run_agent(url: &str, agent: &str) -> Value {
    common::e2b_agent(AGENT, url, agent, &[]).await
}
