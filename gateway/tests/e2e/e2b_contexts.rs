//! The code interpreter's contexts (docs/e2b.md) driven by E2B's own Python SDK
//! (`e2b-code-interpreter`) through the real stack (dockerd, runsc, PostgreSQL): each context
//! its own interpreter in the same sandbox (separate variables, separate processes), a bash
//! context, the cwd honoured, a restart clears the state, a removed context is E2B's not-found,
//! the fifth context refused, another sandbox's context id refused, the `/contexts` calls
//! refused without the sandbox's token (or with another sandbox's), a context's runner unable
//! to signal its init, and every cell recorded as a session execution naming its context.

use crate::common;

use common::TestGateway;

/// What the agent platform does, with E2B's SDK. Prints one JSON line with what it saw.
const AGENT: &str = r#"
import json
from e2b_code_interpreter import Sandbox
from e2b import NotFoundException, SandboxException

def err(f):
    try:
        f()
        return "no error"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)

out = {}
sbx = Sandbox.create(timeout=180)
out["id"] = sbx.sandbox_id
a = sbx.create_code_context()
b = sbx.create_code_context(cwd="/tmp", language="python")
out["created"] = [a.language, a.cwd, b.language, b.cwd]
out["ids"] = [a.id, b.id]

# Separate state: the same name holds three values in three interpreters.
sbx.run_code("x = 'in a'", context=a)
sbx.run_code("x = 'in b'", context=b)
sbx.run_code("x = 'default'")
out["values"] = [sbx.run_code("x", context=a).text, sbx.run_code("x", context=b).text,
                 sbx.run_code("x").text]
pid = "import os; os.getpid()"
out["pids"] = [sbx.run_code(pid, context=a).text, sbx.run_code(pid, context=b).text,
               sbx.run_code(pid).text]
out["cwds"] = [sbx.run_code("import os; os.getcwd()", context=c).text for c in (a, b)]
# The context's runner is the program's user, and its init is out of its reach.
out["init_reach"] = sbx.run_code(
    "import os\ntry:\n    os.kill(os.getppid(), 9)\n    r = 'signalled'\n"
    "except PermissionError:\n    r = 'EPERM'\nr", context=a).text
out["uid"] = sbx.run_code("import os; os.getuid()", context=a).text
# Its init's memory and descriptors (its stdin carries the turns' nonces) are closed to it,
# as PID 1's are to the default context's runner.
PROBE = """
import os
def probe(pid):
    out = []
    for path in ("/proc/%d/mem" % pid, "/proc/%d/fd/0" % pid, "/proc/%d/environ" % pid):
        try:
            with open(path, "rb") as f:
                f.read(1)
            out.append("read")
        except OSError as err:
            out.append(type(err).__name__)
    return out
"""
out["init_files"] = sbx.run_code(PROBE + "str(probe(os.getppid()))", context=a).text
out["pid1_files"] = sbx.run_code(PROBE + "str(probe(1))").text
out["stream"] = []
sbx.run_code("print('one'); print('two')", context=b,
             on_stdout=lambda m: out["stream"].append(m.line))

# A bash context keeps its shell's state from cell to cell.
sh = sbx.create_code_context(language="bash")
sbx.run_code("export GREETING=hi; cd /tmp", context=sh)
out["bash"] = sbx.run_code('echo "$GREETING from $PWD"', context=sh).logs.stdout
out["bash_error"] = sbx.run_code("(exit 3)", context=sh).error.value

out["listed"] = [[c.id, c.language, c.cwd] for c in sbx.list_code_contexts()]

# A cwd the sandbox cannot enter: refused with the init's words, and not counted.
out["bad_cwd"] = err(lambda: sbx.create_code_context(cwd="/nonexistent/dir"))
# At most four besides the default one.
d = sbx.create_code_context()
out["fifth"] = err(lambda: sbx.create_code_context())

# A restart clears the state, keeps the id.
sbx.restart_code_context(a)
e = sbx.run_code("x", context=a).error
out["after_restart"] = [e.name, sbx.run_code("y = 1; y", context=a).text]

# A removed context is gone: E2B's not-found.
sbx.remove_code_context(b)
out["removed_run"] = err(lambda: sbx.run_code("x", context=b))
out["removed_again"] = err(lambda: sbx.remove_code_context(b))
out["listed_after"] = [c.id for c in sbx.list_code_contexts()]
out["default_removal"] = err(lambda: sbx.remove_code_context("default"))

# Another sandbox knows none of these contexts; its token opens none of this one's.
other = Sandbox.create(timeout=120)
out["other_run"] = err(lambda: other.run_code("x", context=a))
out["other_restart"] = err(lambda: other.restart_code_context(a))
out["other_still"] = sbx.run_code("y", context=a).text
url = sbx._jupyter_url + "/contexts"
base = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
out["no_token"] = sbx._client.get(url, headers=base).status_code
out["other_token"] = sbx._client.get(
    url, headers=dict(base, **{"E2B-Traffic-Access-Token": other.traffic_access_token})).status_code
out["own_token"] = sbx._client.get(
    url, headers=dict(base, **{"E2B-Traffic-Access-Token": sbx.traffic_access_token})).status_code
other.kill()
sbx.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn e2b_contexts_are_separate_interpreters_each_cell_recorded() {
    common::require_docker();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), |config| {
        config.max_sessions = 4;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let said = common::e2b_agent(AGENT, &gw.url, &agent, &[]).await;
    eprintln!("the agent saw: {said:#}");
    let id = said["id"].as_str().unwrap().to_owned();
    let (a, b) = (
        said["ids"][0].as_str().unwrap().to_owned(),
        said["ids"][1].as_str().unwrap().to_owned(),
    );

    assert_eq!(
        said["created"],
        serde_json::json!(["python", "/home/user", "python", "/tmp"])
    );
    assert_eq!(
        said["values"],
        serde_json::json!(["in a", "in b", "default"]),
        "each context keeps its own variables"
    );
    let pids: Vec<&str> = said["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        pids[0] != pids[1] && pids[1] != pids[2] && pids[0] != pids[2],
        "three interpreters: {pids:?}"
    );
    assert_eq!(said["cwds"], serde_json::json!(["/home/user", "/tmp"]));
    assert_eq!(
        said["init_reach"], "EPERM",
        "a context's runner cannot signal its init"
    );
    assert_eq!(said["uid"], "65534");
    // Memory and stdin closed; `environ` (the container's environment, no secret in it) is
    // readable under gVisor for PID 1 as for a context's init.
    assert_eq!(
        said["init_files"], "['PermissionError', 'PermissionError', 'read']",
        "a context's init's memory and stdin are closed to its runner: {said}"
    );
    assert_eq!(said["init_files"], said["pid1_files"], "as PID 1 is");
    let streamed: String = said["stream"]
        .as_array()
        .unwrap()
        .iter()
        .map(|line| line.as_str().unwrap())
        .collect();
    assert_eq!(
        streamed, "one\ntwo\n",
        "a context's cell streams its stdout"
    );
    assert_eq!(said["bash"], serde_json::json!(["hi from /tmp\n"]));
    assert_eq!(said["bash_error"], "exit status 3");

    let listed = said["listed"].as_array().unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert_eq!(
        listed[0],
        serde_json::json!(["default", "python", "/home/user"])
    );
    assert_eq!(listed[3][1], "bash");
    let bad_cwd = said["bad_cwd"].as_str().unwrap();
    assert!(
        bad_cwd.contains("400") && bad_cwd.contains("/nonexistent/dir"),
        "{bad_cwd}"
    );
    let fifth = said["fifth"].as_str().unwrap();
    assert!(
        fifth.contains("429") && fifth.contains("has 4 code contexts already"),
        "{fifth}"
    );

    assert_eq!(said["after_restart"], serde_json::json!(["NameError", "1"]));
    let removed = said["removed_run"].as_str().unwrap();
    assert!(
        removed.starts_with("NotFoundException")
            && removed.contains(&format!("Context {b} not found")),
        "{removed}"
    );
    assert!(
        said["removed_again"]
            .as_str()
            .unwrap()
            .starts_with("NotFoundException"),
        "{}",
        said["removed_again"]
    );
    let after: Vec<&str> = said["listed_after"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        !after.contains(&b.as_str()) && after.contains(&a.as_str()),
        "{after:?}"
    );
    assert!(
        said["default_removal"]
            .as_str()
            .unwrap()
            .contains("the default context is the sandbox's own runner"),
        "{}",
        said["default_removal"]
    );

    for call in ["other_run", "other_restart"] {
        let refused = said[call].as_str().unwrap();
        assert!(
            refused.starts_with("NotFoundException")
                && refused.contains(&format!("Context {a} not found")),
            "{call}: {refused}"
        );
    }
    assert_eq!(
        said["other_still"], "1",
        "the context named elsewhere goes on"
    );
    assert_eq!(said["no_token"], 401);
    assert_eq!(said["other_token"], 401);
    assert_eq!(said["own_token"], 200);

    recorded(&gw, &id, &a).await;
    gw.stop().await;
}

/// Every cell is a session execution of the sandbox, decided with `request.e2b.context`.
async fn recorded(gw: &TestGateway, id: &str, a: &str) {
    let pool = gw.pool().await;
    let by_context: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT a.input -> 'request' -> 'e2b' ->> 'context', count(*) FROM audit_events a \
         JOIN executions e ON e.id = a.execution_id \
         WHERE e.session_id = $1 AND a.kind = 'execution.decision' \
         AND a.input -> 'request' -> 'e2b' ->> 'call' = 'run_code' GROUP BY 1 ORDER BY 1",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    let in_a = by_context
        .iter()
        .find(|(context, _)| context.as_deref() == Some(a))
        .map(|(_, n)| *n);
    // x=, x, pid, cwd, init_reach, uid, probe; after the restart: x, y=; y after the other
    // sandbox's refused calls.
    assert_eq!(in_a, Some(10), "{by_context:?}");
    let default = by_context
        .iter()
        .find(|(context, _)| context.is_none())
        .map(|(_, n)| *n);
    assert_eq!(default, Some(4), "{by_context:?}");
    let languages: Vec<(String, String)> = sqlx::query_as(
        "SELECT e.language, e.status FROM audit_events a JOIN executions e \
         ON e.id = a.execution_id WHERE e.session_id = $1 AND a.kind = 'execution.decision' \
         AND a.input -> 'request' -> 'e2b' ->> 'context' IS NOT NULL \
         AND e.language = 'bash' ORDER BY e.created_at",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        languages,
        vec![
            ("bash".to_owned(), "succeeded".to_owned()),
            ("bash".to_owned(), "succeeded".to_owned()),
            ("bash".to_owned(), "failed".to_owned()),
        ]
    );
    pool.close().await;
}

/// A cell past its deadline in a context, then in the default context.
const TIMEOUT_AGENT: &str = r#"
import json
from e2b_code_interpreter import Sandbox

def err(f):
    try:
        f()
        return "no error"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)

out = {}
sbx = Sandbox.create(timeout=120)
out["id"] = sbx.sandbox_id
c = sbx.create_code_context()
sbx.run_code("kept = 1", context=c)
e = sbx.run_code("import time\ntime.sleep(30)", context=c).error
out["timed_out"] = [e.name, e.value] if e else None
out["after"] = err(lambda: sbx.run_code("kept", context=c))
out["listed"] = [x.id for x in sbx.list_code_contexts()] == ["default", c.id]
sbx.restart_code_context(c)
out["restarted"] = [sbx.run_code("2", context=c).text,
                    sbx.run_code("kept", context=c).error.name]
sbx.run_code("default_kept = 3")
e = sbx.run_code("import time\ntime.sleep(30)").error
out["default_timed_out"] = e.value if e else None
out["default_after"] = sbx.run_code("default_kept").text
sbx.kill()
print(json.dumps(out))
"#;

/// A deadline cannot interrupt a context's cell (its init is out of everyone's reach but the
/// gateway's exec): it ends the context, recorded `timeout`; the context answers "ended" until
/// restarted, the sandbox and its default context go on.
#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_cell_ends_its_context_until_restarted() {
    common::require_docker();
    let policies = common::copy_of_shipped();
    // A tenant as acme, with a 4 s deadline (the bundle's own tests keep acme's).
    let tenants = policies.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let mut tenant = data["tenants"]["acme"].clone();
    tenant["limits"]["timeout_ms"] = serde_yaml_ng::Value::from(4000);
    data["tenants"]["ctxtest"] = tenant;
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    let policy_dir = policies.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
    })
    .await;
    let agent = gw.key("agent", "ctxtest").await;
    let said = common::e2b_agent(TIMEOUT_AGENT, &gw.url, &agent, &[]).await;
    eprintln!("the agent saw: {said:#}");
    assert!(said["timed_out"].is_array(), "{said}");
    let after = said["after"].as_str().unwrap();
    assert!(
        after.contains("409") && after.contains("ended") && after.contains("restart_code_context"),
        "{after}"
    );
    assert_eq!(said["listed"], true);
    assert_eq!(said["restarted"], serde_json::json!(["2", "NameError"]));
    assert!(said["default_timed_out"].is_string(), "{said}");
    assert_eq!(
        said["default_after"], "3",
        "the default context is interrupted and goes on"
    );
    let pool = gw.pool().await;
    let statuses: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM executions WHERE session_id = $1 ORDER BY created_at",
    )
    .bind(said["id"].as_str().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        statuses,
        [
            "succeeded",
            "timeout",
            "succeeded",
            "failed",
            "succeeded",
            "timeout",
            "succeeded"
        ],
        "the refused cell after the end left no record"
    );
    pool.close().await;
    gw.stop().await;
}
