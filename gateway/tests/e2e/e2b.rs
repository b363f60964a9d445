//! The E2B-compatible API (`/e2b`, docs/e2b.md) driven by E2B's own Python SDK (`e2b` from
//! PyPI, pinned in scripts/setup.sh) exactly as an agent platform runs it: only
//! `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` point it here. Real dockerd, runsc,
//! PostgreSQL behind it; every sandbox a session, every command a recorded session execution.

use crate::common;

use common::TestGateway;
use serde_json::Value;

/// A policy bundle that also denies E2B sandboxes asking for `purpose: forbidden`, and
/// commands run with a 4.321 s timeout (the SDK sends it as the turn's `timeout_ms`).
const E2B_TEST_RULES: &str = r#"package sandgate.execution

deny contains {"code": "e2b.purpose_forbidden", "message": "E2B sandboxes for purpose forbidden are refused"} if {
	input.request.kind == "session"
	input.request.e2b.template == "base"
	input.request.labels.purpose == "forbidden"
}

deny contains {"code": "e2b.command_refused", "message": "this command timeout is refused by policy"} if {
	input.request.kind == "session_execution"
	input.request.e2b.call == "commands.run"
	input.request.limits.timeout_ms == 4321
}
"#;

/// What the agent platform does, with E2B's SDK. Prints one JSON line with what it saw.
const AGENT: &str = r#"
import json, os, sys
import httpx
from e2b import Sandbox, SandboxQuery, CommandExitException, SandboxException, NotFoundException
from e2b.exceptions import AuthenticationException

out = {}
sbx = Sandbox.create(template="base", timeout=120, metadata={"run": "e2e"}, envs={"FROM_CREATE": "c1"})
out["id"] = sbx.sandbox_id
r = sbx.commands.run("echo hello; echo oops >&2")
out["stdout"], out["stderr"], out["exit"] = r.stdout, r.stderr, r.exit_code
r = sbx.commands.run('echo "$FROM_CREATE-$FROM_CALL"', envs={"FROM_CALL": "e1"})
out["envs"] = r.stdout
r = sbx.commands.run("pwd", cwd="/tmp")
out["cwd"] = r.stdout
try:
    sbx.commands.run("exit 3")
    out["nonzero"] = "no exception"
except CommandExitException as e:
    out["nonzero"] = e.exit_code
try:
    sbx.commands.run("echo never", timeout=4.321)
    out["command_denied"] = "ran"
except SandboxException as e:
    out["command_denied"] = str(e)
out["processes"] = len(sbx.commands.list())
bg = sbx.commands.run("sleep 30", background=True)
out["bg_listed"] = [p.pid for p in sbx.commands.list()] == [bg.pid]
out["bg_killed"] = bg.kill()
try:
    bg.wait()
    out["bg_end"] = "no exception"
except CommandExitException as e:
    out["bg_end"] = "exited" if e.exit_code != 0 else "exit 0"
out["running"] = sbx.is_running()
info = sbx.get_info()
out["info"] = {"id": info.sandbox_id, "template": info.template_id, "metadata": info.metadata, "state": str(info.state)}
listed = Sandbox.list(query=SandboxQuery(metadata={"run": "e2e"})).next_items()
out["listed"] = [s.sandbox_id for s in listed]
out["listed_other"] = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"run": "nope"})).next_items()]
sbx.set_timeout(60)
out["end_after_timeout"] = (sbx.get_info().end_at - info.started_at).total_seconds()

second = Sandbox.create(template="base", timeout=120)
base = os.environ["E2B_SANDBOX_URL"]
def envd_list(sandbox_id, token):
    headers = {"E2b-Sandbox-Id": sandbox_id, "Content-Type": "application/json"}
    if token is not None:
        headers["X-Access-Token"] = token
    return httpx.post(base + "/process.Process/List", headers=headers, content=b"{}").status_code
out["own_token"] = envd_list(second.sandbox_id, second._envd_access_token)
out["other_token"] = envd_list(second.sandbox_id, sbx._envd_access_token)
out["no_token"] = envd_list(second.sandbox_id, None)

other = os.environ["OTHER_KEY"]
try:
    Sandbox.get_info(sbx.sandbox_id, api_key=other)
    out["other_tenant_info"] = "visible"
except NotFoundException as e:
    out["other_tenant_info"] = "not found"
out["other_tenant_kill"] = Sandbox.kill(sbx.sandbox_id, api_key=other)
out["other_tenant_list"] = [s.sandbox_id for s in Sandbox.list(api_key=other).next_items()]

try:
    Sandbox.create(template="base", metadata={"purpose": "forbidden"})
    out["create_denied"] = "created"
except SandboxException as e:
    out["create_denied"] = str(e)
try:
    Sandbox.create(template="no-such-template")
    out["unknown_template"] = "created"
except SandboxException as e:
    out["unknown_template"] = str(e)
try:
    Sandbox.create(template="base", api_key="sgk_0000000000000000_" + "0" * 64)
    out["bad_key"] = "created"
except AuthenticationException as e:
    out["bad_key"] = "refused"

from e2b_code_interpreter import Sandbox as CodeInterpreter
ci = CodeInterpreter.create()
try:
    ci.commands.run("echo from-python; exit 4")
    out["ci_command"] = "exit 0"
except CommandExitException as e:
    out["ci_command"] = [e.stdout, e.exit_code]
try:
    out["run_code"] = ci.run_code("1 + 1").text
except Exception as e:
    out["run_code"] = str(e)
ci.kill()

out["killed"] = sbx.kill()
out["running_after_kill"] = sbx.is_running()
out["killed_again"] = Sandbox.kill(sbx.sandbox_id)
second.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_e2b_python_sdk_runs_commands_in_sandgate_sessions() {
    common::require_docker();
    let policies = common::copy_of_shipped();
    std::fs::write(policies.path().join("e2b_test.rego"), E2B_TEST_RULES).unwrap();
    let policy_dir = policies.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
        config.max_sessions = 4;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let other = gw.key("agent", "forge").await;
    let said = run_agent(&gw.url, &agent, &other).await;
    let id = said["id"].as_str().unwrap().to_owned();

    assert_eq!(said["stdout"], "hello\n");
    assert_eq!(said["stderr"], "oops\n");
    assert_eq!(said["exit"], 0);
    assert_eq!(
        said["envs"], "c1-e1\n",
        "create's envs and the call's reach the command"
    );
    assert_eq!(said["cwd"], "/tmp\n");
    assert_eq!(
        said["nonzero"], 3,
        "a non-zero exit raises CommandExitException"
    );
    let denied = said["command_denied"].as_str().unwrap();
    assert!(
        denied.contains("this command timeout is refused by policy"),
        "{denied}"
    );
    assert_eq!(said["processes"], 0);
    assert_eq!(
        said["bg_listed"], true,
        "a background command is listed while it runs"
    );
    assert_eq!(said["bg_killed"], true);
    assert_eq!(
        said["bg_end"], "exited",
        "a killed command ends without success"
    );
    assert_eq!(said["running"], true);
    assert_eq!(said["info"]["id"], id.as_str());
    assert_eq!(said["info"]["template"], "base");
    assert_eq!(said["info"]["metadata"]["run"], "e2e");
    assert_eq!(said["listed"], serde_json::json!([id]));
    assert_eq!(said["listed_other"], serde_json::json!([]));
    let end = said["end_after_timeout"].as_f64().unwrap();
    assert!(end < 100.0, "set_timeout(60) moved the end: {end}");

    assert_eq!(said["own_token"], 200);
    assert_eq!(
        said["other_token"], 401,
        "one sandbox's token is refused on another"
    );
    assert_eq!(said["no_token"], 401);
    assert_eq!(said["other_tenant_info"], "not found");
    assert_eq!(said["other_tenant_kill"], false);
    assert_eq!(said["other_tenant_list"], serde_json::json!([]));

    let refused = said["create_denied"].as_str().unwrap();
    assert!(refused.starts_with("403: "), "{refused}");
    assert!(
        refused.contains("E2B sandboxes for purpose forbidden are refused"),
        "{refused}"
    );
    let unknown = said["unknown_template"].as_str().unwrap();
    assert!(unknown.contains("base, code-interpreter-v1"), "{unknown}");
    assert_eq!(said["bad_key"], "refused");

    assert_eq!(
        said["ci_command"],
        serde_json::json!(["from-python\n", 4]),
        "commands run in the code-interpreter template's Python session too"
    );
    // Wired in e2b/interpreter.rs (e2e: e2b_files::).
    assert_eq!(said["run_code"], "2");
    assert_eq!(said["killed"], true);
    assert_eq!(said["running_after_kill"], false);
    assert_eq!(said["killed_again"], false);

    audited(&gw, &id).await;
    gw.stop().await;
}

/// Every command is a session execution of the sandbox, decided with `request.e2b.call` and
/// recorded with its exit; the denied one too.
async fn audited(gw: &TestGateway, id: &str) {
    let pool = gw.pool().await;
    let rows: Vec<(String, bool, Option<i32>)> = sqlx::query_as(
        "SELECT e.status, e.allow, e.exit_code FROM executions e WHERE e.session_id = $1 \
         ORDER BY e.created_at",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    let exits: Vec<Option<i32>> = rows.iter().map(|r| r.2).collect();
    assert_eq!(
        exits,
        vec![Some(0), Some(0), Some(0), Some(3), None, None],
        "{rows:?}"
    );
    assert!(
        !rows[4].1,
        "the denied command is recorded as denied: {rows:?}"
    );
    assert_eq!(
        rows[5].0, "killed",
        "the killed one is recorded killed: {rows:?}"
    );
    let decided: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events a JOIN executions e ON e.id = a.execution_id \
         WHERE e.session_id = $1 AND a.kind = 'execution.decision' \
         AND a.input -> 'request' -> 'e2b' ->> 'call' = 'commands.run'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(decided, 6, "each command's decision names the SDK call");
    let template: String = sqlx::query_scalar(
        "SELECT input -> 'request' -> 'request' -> 'e2b' ->> 'template' FROM audit_events \
         WHERE kind = 'session.created' AND input ->> 'session_id' = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(template, "base");
    pool.close().await;
}

async fn run_agent(url: &str, agent: &str, other: &str) -> Value {
    run_script(AGENT, url, agent, other).await
}

async fn run_script(script: &'static str, url: &str, agent: &str, other: &str) -> Value {
    common::e2b_agent(script, url, agent, &[("OTHER_KEY", other)]).await
}

/// The copy's network part, with sessions labelled `purpose: review` sent to a reviewer first.
const HOLD_RULE: &str = r#"network_part := {"require_approval": true, "reasons": [{"code": "e2b.review", "message": "E2B sandboxes for purpose review need a reviewer"}]} if {
	input.request.kind == "session"
	input.request.labels.purpose == "review"
} else := {"require_approval": false, "reasons": []} if {"#;

/// Asks for a sandbox the policy holds; prints what the SDK raised.
const HELD_CREATE: &str = r#"
import json
from e2b import Sandbox, SandboxException
from e2b.exceptions import ServiceBusyException
try:
    Sandbox.create(template="base", metadata={"purpose": "review"})
    print(json.dumps({"raised": "nothing"}))
except ServiceBusyException as e:
    print(json.dumps({"raised": "ServiceBusyException", "message": str(e)}))
"#;

/// Once approved: connects to the held sandbox by id and runs a command in it.
const AFTER_REVIEW: &str = r#"
import json, os
from e2b import Sandbox
sbx = Sandbox.connect(os.environ["OTHER_KEY"])
r = sbx.commands.run("echo approved")
print(json.dumps({"stdout": r.stdout, "info": sbx.get_info().state}))
sbx.kill()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_held_e2b_create_is_not_ready_until_a_reviewer_approves_it() {
    common::require_docker();
    let policies = common::copy_of_shipped();
    let rego = policies.path().join("execution.rego");
    let text = std::fs::read_to_string(&rego).unwrap();
    let anchor = "network_part := {\"require_approval\": false, \"reasons\": []} if {";
    assert!(text.contains(anchor));
    std::fs::write(&rego, text.replacen(anchor, HOLD_RULE, 1)).unwrap();
    let policy_dir = policies.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let reviewer = gw.key("reviewer", "acme").await;

    let said = run_script(HELD_CREATE, &gw.url, &agent, "").await;
    assert_eq!(said["raised"], "ServiceBusyException", "{said}");
    let message = said["message"].as_str().unwrap();
    assert!(message.contains("held for human review"), "{message}");
    assert!(
        message.contains("E2B sandboxes for purpose review need a reviewer"),
        "{message}"
    );
    let approval = word_after(message, "(approval ");
    let sandbox = word_after(message, "sandbox ");
    assert!(
        approval.starts_with("ap_") && sandbox.starts_with("ss_"),
        "{message}"
    );

    let (status, body) = gw
        .post(
            &reviewer,
            &format!("/v1/approvals/{approval}"),
            &serde_json::json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The sandbox id rides in OTHER_KEY: the script's one free parameter.
    let said = run_script(AFTER_REVIEW, &gw.url, &agent, &sandbox).await;
    assert_eq!(said["stdout"], "approved\n", "{said}");
    gw.stop().await;
}

/// The word after `marker` in `text` (up to a space, `)` or `:`).
fn word_after(text: &str, marker: &str) -> String {
    let rest = &text[text.find(marker).unwrap() + marker.len()..];
    rest.split([' ', ')', ':']).next().unwrap().to_owned()
}

/// `e2b.enabled: false`: nothing answers under `/e2b` but the API's own 404.
#[tokio::test(flavor = "multi_thread")]
async fn with_e2b_disabled_its_paths_are_not_found() {
    let gw = TestGateway::start_with(Some(common::fresh_database().await), |config| {
        config.e2b.enabled = false;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let response = gw
        .http
        .post(format!("{}/e2b/v2/sandboxes", gw.url))
        .header("x-api-key", &agent)
        .json(&serde_json::json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&gw.pool().await)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    gw.stop().await;
}
