//! The E2B-compatible API's walls (issue 23 items 5 and 6, docs/e2b.md "Tenancy and bad
//! input"): what E2B's own Python SDK (`e2b` from PyPI, pinned in scripts/setup.sh) and raw
//! HTTP see when they reach past their sandbox: another tenant's sandbox (404 in E2B's shape
//! for list, info, kill, set_timeout, refreshes, connect; no envd call with a token of its
//! own), another sandbox's access token or process id (same tenant too), a killed sandbox, and
//! malformed Connect envelopes, JSON and protobuf bodies and oversized uploads. Nothing refused
//! touches the sandbox: its command and files are intact afterwards, and no session execution
//! is recorded for a refused call. Real dockerd, runsc, PostgreSQL behind it. What the SDK
//! assumes of the sandbox (`user`, `/home/user`) is here too: it is the same SDK run.
//! `e2b.rs` and `e2b_files.rs` cover the rest (info/kill/list by another tenant through the
//! SDK, path traversal, symlinks, the 17 MiB SDK upload).

use crate::common;

use common::TestGateway;
use serde_json::{json, Value};

/// The largest file an upload may carry (`sandbox_protocol::MAX_FILE_BYTES`, 16 MiB) and the
/// largest upload request (that plus 64 KiB of multipart framing): docs/e2b.md.
const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;
const MAX_UPLOAD_BYTES: usize = MAX_FILE_BYTES + 64 * 1024;

/// Two tenants' agent platforms, then an agent poking at the wire. Prints one JSON line.
const AGENT: &str = r#"
import json, os, struct
import httpx
from e2b import Sandbox, SandboxException, NotFoundException
from e2b_code_interpreter import Sandbox as CodeInterpreter

base = os.environ["E2B_SANDBOX_URL"]
api = os.environ["E2B_API_URL"]
other_key = os.environ["OTHER_KEY"]
max_file, max_upload = int(os.environ["MAX_FILE"]), int(os.environ["MAX_UPLOAD"])

def attempt(fn):
    try:
        r = fn()
        return ["ok", r if isinstance(r, (bool, int, str, type(None))) else type(r).__name__]
    except Exception as e:
        return [type(e).__name__, str(e)]

def answer(r):
    try:
        body = r.json()
    except Exception:
        body = r.text
    return {"status": r.status_code, "body": body, "type": r.headers.get("content-type", "")}

def envd(sandbox_id, token, path, content, content_type="application/json", extra=None):
    headers = {"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token, "Content-Type": content_type}
    headers.update(extra or {})
    return httpx.post(base + path, headers=headers, content=content, timeout=30)

def frames(raw):
    # A server stream's envelopes: [flags, json] each.
    out, i = [], 0
    while i + 5 <= len(raw):
        flags, n = raw[i], struct.unpack(">I", raw[i + 1:i + 5])[0]
        out.append([flags, json.loads(raw[i + 5:i + 5 + n] or b"null")])
        i += 5 + n
    return out

def stream(sandbox_id, token, body, content_type="application/connect+json"):
    r = envd(sandbox_id, token, "/process.Process/Start", body, content_type, {"Connect-Protocol-Version": "1"})
    return {"status": r.status_code, "frames": frames(r.content) if r.status_code == 200 else None,
            "body": None if r.status_code == 200 else answer(r)["body"]}

def env(msg):
    data = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(data)) + data

out = {}
# --- what the SDK assumes of the sandbox -----------------------------------------------------
mine = Sandbox.create(template="base", timeout=120, metadata={"who": "acme"})
r = mine.commands.run("whoami; pwd; echo $HOME; id -u; touch ~/made-by-user && ls -l ~/made-by-user | awk '{print $3}'")
out["identity"] = r.stdout.split()
mine.files.write("relative.txt", "at home")
out["relative_read"] = mine.files.read("/home/user/relative.txt")
out["relative_listed"] = sorted(e.name for e in mine.files.list("/home/user"))
r = mine.commands.run("cat relative.txt; echo; touch /etc/x 2>/dev/null || echo root-read-only; echo $PATH")
out["home_cwd"] = r.stdout.splitlines()
ci = CodeInterpreter.create(timeout=120)
cell = "import os, getpass\nopen('cell.txt', 'w').write('from a cell')\n(os.getcwd(), os.environ['HOME'], getpass.getuser())"
out["cell_identity"] = ci.run_code(cell).text
out["cell_file"] = ci.files.read("cell.txt")
out["ci_command"] = ci.commands.run("pwd; whoami").stdout.split()
ci.kill()

# --- tenancy ---------------------------------------------------------------------------------
theirs = Sandbox.create(template="base", timeout=120, api_key=other_key)
out["other_list"] = [s.sandbox_id for s in Sandbox.list(api_key=other_key).next_items()]
out["other_list_v1"] = [s["sandboxID"] for s in httpx.get(api + "/sandboxes", headers={"X-API-KEY": other_key}).json()]
out["other_set_timeout"] = attempt(lambda: Sandbox.set_timeout(mine.sandbox_id, 30, api_key=other_key))
out["other_connect"] = attempt(lambda: Sandbox.connect(mine.sandbox_id, api_key=other_key))
h = {"X-API-KEY": other_key}
out["raw_other"] = {
    "info": answer(httpx.get(f"{api}/sandboxes/{mine.sandbox_id}", headers=h)),
    "kill": answer(httpx.delete(f"{api}/sandboxes/{mine.sandbox_id}", headers=h)),
    "timeout": answer(httpx.post(f"{api}/sandboxes/{mine.sandbox_id}/timeout", headers=h, json={"timeout": 5})),
    "refreshes": answer(httpx.post(f"{api}/sandboxes/{mine.sandbox_id}/refreshes", headers=h, json={"duration": 5})),
    "connect": answer(httpx.post(f"{api}/v2/sandboxes/{mine.sandbox_id}/connect", headers=h, json={"timeout": 5})),
}
# Their own valid token, aimed at my sandbox, on every envd surface.
tt = theirs._envd_access_token
out["their_token_on_mine"] = {
    "process_list": envd(mine.sandbox_id, tt, "/process.Process/List", b"{}").status_code,
    "stat": envd(mine.sandbox_id, tt, "/filesystem.Filesystem/Stat", json.dumps({"path": "/home/user/relative.txt"})).status_code,
    "files_get": httpx.get(base + "/files", params={"path": "/home/user/relative.txt"}, headers={"E2b-Sandbox-Id": mine.sandbox_id, "X-Access-Token": tt}).status_code,
    "files_post": httpx.post(base + "/files", params={"path": "/home/user/planted.txt"}, headers={"E2b-Sandbox-Id": mine.sandbox_id, "X-Access-Token": tt, "Content-Type": "application/octet-stream"}, content=b"x").status_code,
    "execute": envd(mine.sandbox_id, tt, "/execute", json.dumps({"code": "print(1)"})).status_code,
    "start": stream(mine.sandbox_id, tt, env({"process": {"cmd": "/bin/echo", "args": ["planted"]}})),
    "health": httpx.get(base + "/health", headers={"E2b-Sandbox-Id": mine.sandbox_id, "X-Access-Token": tt}).status_code,
}
# Same tenant, two sandboxes: the first one's token and process ids stay the first one's.
second = Sandbox.create(template="base", timeout=120)
mt, st = mine._envd_access_token, second._envd_access_token
out["token_on_sibling"] = {
    "stat": answer(envd(second.sandbox_id, mt, "/filesystem.Filesystem/Stat", json.dumps({"path": "/home/user"}))),
    "files_get": httpx.get(base + "/files", params={"path": "/home/user"}, headers={"E2b-Sandbox-Id": second.sandbox_id, "X-Access-Token": mt}).status_code,
    "execute": envd(second.sandbox_id, mt, "/execute", json.dumps({"code": "print(1)"})).status_code,
}
bg = mine.commands.run("sleep 60", background=True)
out["signal_other_pid"] = answer(envd(second.sandbox_id, st, "/process.Process/SendSignal",
    json.dumps({"process": {"pid": bg.pid}, "signal": "SIGNAL_SIGKILL"})))
out["bg_still_listed"] = [p.pid for p in mine.commands.list()] == [bg.pid]
bg.kill()

# --- bad input on envd routes ----------------------------------------------------------------
msg = env({"process": {"cmd": "/bin/echo", "args": ["never"]}})
out["bad_stream"] = {
    "short": stream(mine.sandbox_id, mt, b"\x00\x00"),
    "length_mismatch": stream(mine.sandbox_id, mt, msg[:-3]),
    "two_messages": stream(mine.sandbox_id, mt, msg + msg),
    "compressed": stream(mine.sandbox_id, mt, b"\x01" + msg[1:]),
    "over_limit": stream(mine.sandbox_id, mt, struct.pack(">BI", 0, 2 * 1024 * 1024) + b"{}"),
    "not_json": stream(mine.sandbox_id, mt, struct.pack(">BI", 0, 5) + b"{nope"),
    "wrong_types": stream(mine.sandbox_id, mt, env({"process": {"cmd": 5}})),
    "no_cmd": stream(mine.sandbox_id, mt, env({"process": {"cmd": ""}})),
    "protobuf": stream(mine.sandbox_id, mt, b"\x00\x00\x00\x00\x06\x0a\x04\x0a\x02ls", "application/connect+proto"),
}
out["bad_unary"] = {
    "not_json": answer(envd(mine.sandbox_id, mt, "/filesystem.Filesystem/Stat", b"{\"path\":")),
    "wrong_types": answer(envd(mine.sandbox_id, mt, "/filesystem.Filesystem/Stat", b"{\"path\": 5}")),
    "protobuf": answer(envd(mine.sandbox_id, mt, "/filesystem.Filesystem/Stat", b"\x0a\x05/etc/", "application/proto")),
    "unknown_method": answer(envd(mine.sandbox_id, mt, "/process.Process/Nope", b"{}")),
    "execute_not_json": answer(envd(mine.sandbox_id, mt, "/execute", b"print(1)")),
    "no_sandbox_header": httpx.post(base + "/process.Process/List", headers={"X-Access-Token": mt, "Content-Type": "application/json"}, content=b"{}").status_code,
}
def upload(path, data, content_type="application/octet-stream"):
    return answer(httpx.post(base + "/files", params={"path": path}, content=data, timeout=60,
        headers={"E2b-Sandbox-Id": mine.sandbox_id, "X-Access-Token": mt, "Content-Type": content_type}))
out["uploads"] = {
    "file_over_limit": upload("/home/user/big.bin", b"\0" * (max_file + 1)),
    "request_over_limit": upload("/home/user/bigger.bin", b"\0" * (max_upload + 1)),
    "at_limit": upload("/tmp/at-limit.bin", b"\1" * max_file),
    "multipart_no_boundary": upload("/home/user/m.txt", b"--x\r\n", "multipart/form-data"),
    "multipart_broken": upload("/home/user/m.txt", b"garbage", "multipart/form-data; boundary=xyz"),
}
out["after_bad_input"] = {
    "big_exists": mine.files.exists("/home/user/big.bin"),
    "bigger_exists": mine.files.exists("/home/user/bigger.bin"),
    "at_limit_size": mine.files.get_info("/tmp/at-limit.bin").size,
    "planted_exists": mine.files.exists("/home/user/planted.txt"),
    "relative_read": mine.files.read("relative.txt"),
    "echo": mine.commands.run("echo still-fine").stdout,
}

# --- a killed sandbox ------------------------------------------------------------------------
out["kill_second"] = second.kill()
out["killed"] = {
    "run": attempt(lambda: second.commands.run("echo after")),
    "read": attempt(lambda: second.files.read("/home/user/x")),
    "write": attempt(lambda: second.files.write("/home/user/x", "x")),
    "is_running": second.is_running(),
    "info": attempt(lambda: Sandbox.get_info(second.sandbox_id)),
    "set_timeout": attempt(lambda: Sandbox.set_timeout(second.sandbox_id, 30)),
    "connect": attempt(lambda: Sandbox.connect(second.sandbox_id)),
    "kill_again": Sandbox.kill(second.sandbox_id),
    "raw_start": stream(second.sandbox_id, st, msg),
    "raw_execute": answer(envd(second.sandbox_id, st, "/execute", json.dumps({"code": "echo", "language": "bash"}))),
}
out["mine_alive"] = mine.commands.run("echo alive").stdout
out["ids"] = {"mine": mine.sandbox_id, "theirs": theirs.sandbox_id, "second": second.sandbox_id}
mine.kill()
theirs.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn e2b_sandboxes_stay_their_tenants_and_refuse_bad_input() {
    common::require_docker();
    // The shipped tenants: only acme opens sessions; forge may too here, as a second tenant.
    let policies = common::copy_of_shipped();
    let tenants = policies.path().join("data/tenants.yaml");
    let text = std::fs::read_to_string(&tenants).unwrap();
    let anchor = "    description: Forge coding agent (runs test suites)\n";
    assert!(text.contains(anchor));
    let text = text.replacen(anchor, &format!("{anchor}    sessions: true\n"), 1);
    std::fs::write(&tenants, text).unwrap();
    let policy_dir = policies.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
        config.max_sessions = 4;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let other = gw.key("agent", "forge").await;
    let said = run_agent(&gw.url, &agent, &other).await;
    let text = said.to_string();
    let mine = said["ids"]["mine"].as_str().unwrap().to_owned();
    let theirs = said["ids"]["theirs"].as_str().unwrap().to_owned();

    the_sandbox_is_e2b_s(&said);
    another_tenant_gets_404(&said, &mine, &theirs);
    tokens_and_pids_stay_their_sandbox_s(&said);
    bad_input_is_refused_clearly(&said);
    a_killed_sandbox_says_so(&said);
    assert_eq!(said["mine_alive"], "alive\n", "{text}");
    audited(&gw, &mine).await;
    gw.stop().await;
}

/// `whoami`, `pwd`, `$HOME` through the SDK: E2B's `user` in `/home/user`, a writable tmpfs
/// on the read-only root; the SDK's relative paths land there; a login shell keeps the PATH.
fn the_sandbox_is_e2b_s(said: &Value) {
    assert_eq!(
        said["identity"],
        json!(["user", "/home/user", "/home/user", "65534", "user"]),
        "{said}"
    );
    assert_eq!(said["relative_read"], "at home");
    assert!(
        said["relative_listed"]
            .as_array()
            .unwrap()
            .contains(&json!("relative.txt")),
        "{said}"
    );
    assert_eq!(
        said["cell_identity"], "('/home/user', '/home/user', 'user')",
        "a run_code cell starts in /home/user too: {said}"
    );
    assert_eq!(said["cell_file"], "from a cell");
    assert_eq!(said["ci_command"], json!(["/home/user", "user"]), "{said}");
    let lines = said["home_cwd"].as_array().unwrap();
    assert_eq!(lines[0], "at home", "commands start in /home/user: {said}");
    assert_eq!(lines[1], "root-read-only", "{said}");
    let path = lines[2].as_str().unwrap();
    assert!(
        path.starts_with("/workspace/.local/bin:"),
        "`bash -l` keeps the sandbox's PATH (pip's user scripts first): {path}"
    );
}

/// What the SDK raised for a 404: its `SandboxNotFoundException` (a `NotFoundException`),
/// naming the sandbox.
fn not_found(raised: &Value, id: &str) {
    assert_eq!(raised[0], "SandboxNotFoundException", "{raised}");
    assert!(raised[1].as_str().unwrap().contains(id), "{raised}");
}

/// E2B's error shape for a control-plane call: `{"code": 404, "message": ...}`.
fn e2b_404(answer: &Value, id: &str) {
    assert_eq!(answer["status"], 404, "{answer}");
    assert_eq!(answer["body"]["code"], 404, "{answer}");
    let message = answer["body"]["message"].as_str().unwrap();
    assert!(
        message.contains(id),
        "the 404 names the id asked for: {answer}"
    );
}

fn another_tenant_gets_404(said: &Value, mine: &str, theirs: &str) {
    assert_eq!(said["other_list"], json!([theirs]), "{said}");
    assert_eq!(said["other_list_v1"], json!([theirs]), "{said}");
    for call in ["other_set_timeout", "other_connect"] {
        not_found(&said[call], mine);
    }
    for call in ["info", "kill", "timeout", "refreshes", "connect"] {
        e2b_404(&said["raw_other"][call], mine);
    }
    let probes = &said["their_token_on_mine"];
    for surface in [
        "process_list",
        "stat",
        "files_get",
        "files_post",
        "execute",
        "health",
    ] {
        assert_eq!(probes[surface], 401, "{surface}: {probes}");
    }
    // A server stream answers 200 and ends with its error (Connect's streaming rule).
    stream_error(&probes["start"], "unauthenticated", "not valid for sandbox");
}

fn tokens_and_pids_stay_their_sandbox_s(said: &Value) {
    let sibling = &said["token_on_sibling"];
    assert_eq!(sibling["stat"]["status"], 401, "{sibling}");
    assert_eq!(
        sibling["stat"]["body"]["code"], "unauthenticated",
        "{sibling}"
    );
    assert_eq!(sibling["files_get"], 401, "{sibling}");
    assert_eq!(sibling["execute"], 401, "{sibling}");
    let signal = &said["signal_other_pid"];
    assert_eq!(signal["status"], 404, "another sandbox's pid: {signal}");
    assert_eq!(signal["body"]["code"], "not_found", "{signal}");
    assert_eq!(
        said["bg_still_listed"], true,
        "the process the pid named still runs in its own sandbox"
    );
}

/// A refused server stream: HTTP 200 and one end-of-stream envelope (flag 2) holding the
/// error, nothing before it (no start event: nothing ran).
fn stream_error(answer: &Value, code: &str, says: &str) {
    assert_eq!(answer["status"], 200, "{answer}");
    let frames = answer["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 1, "{answer}");
    assert_eq!(frames[0][0], 2, "{answer}");
    connect_error(
        &json!({"status": 200, "body": frames[0][1]["error"]}),
        200,
        code,
        says,
    );
}

/// A Connect error: the status and code asked for, and a message saying what was wrong.
fn connect_error(answer: &Value, status: u64, code: &str, says: &str) {
    let body = answer.get("body").unwrap_or(answer);
    assert_eq!(answer["status"], status, "{answer}");
    assert_eq!(body["code"], code, "{answer}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{says:?} in {answer}");
}

fn bad_input_is_refused_clearly(said: &Value) {
    let stream = &said["bad_stream"];
    stream_error(&stream["short"], "invalid_argument", "Connect envelope");
    stream_error(&stream["length_mismatch"], "invalid_argument", "length");
    stream_error(&stream["two_messages"], "invalid_argument", "length");
    stream_error(&stream["compressed"], "invalid_argument", "compressed");
    stream_error(
        &stream["over_limit"],
        "resource_exhausted",
        "limit is 1048576",
    );
    stream_error(&stream["not_json"], "invalid_argument", "not valid JSON");
    stream_error(&stream["wrong_types"], "invalid_argument", "not valid JSON");
    stream_error(&stream["no_cmd"], "invalid_argument", "no cmd");
    stream_error(
        &stream["protobuf"],
        "invalid_argument",
        "application/connect+json",
    );
    let unary = &said["bad_unary"];
    connect_error(
        &unary["not_json"],
        400,
        "invalid_argument",
        "not valid JSON",
    );
    connect_error(
        &unary["wrong_types"],
        400,
        "invalid_argument",
        "not valid JSON",
    );
    connect_error(
        &unary["protobuf"],
        400,
        "invalid_argument",
        "application/json",
    );
    connect_error(&unary["unknown_method"], 501, "unimplemented", "Nope");
    assert_eq!(unary["execute_not_json"]["status"], 400, "{unary}");
    assert_eq!(unary["no_sandbox_header"], 400, "{unary}");

    let uploads = &said["uploads"];
    for over in ["file_over_limit", "request_over_limit"] {
        let answer = &uploads[over];
        assert_eq!(answer["status"], 413, "{over}: {answer}");
        assert_eq!(answer["body"]["code"], 413, "E2B's shape: {answer}");
    }
    assert_eq!(uploads["at_limit"]["status"], 200, "{uploads}");
    for malformed in ["multipart_no_boundary", "multipart_broken"] {
        assert_eq!(uploads[malformed]["status"], 400, "{malformed}: {uploads}");
    }
    let after = &said["after_bad_input"];
    assert_eq!(
        *after,
        json!({
            "big_exists": false, "bigger_exists": false, "at_limit_size": MAX_FILE_BYTES,
            "planted_exists": false, "relative_read": "at home", "echo": "still-fine\n",
        }),
        "nothing refused touched the sandbox, nothing it held was lost"
    );
}

fn a_killed_sandbox_says_so(said: &Value) {
    assert_eq!(said["kill_second"], true);
    let killed = &said["killed"];
    let id = said["ids"]["second"].as_str().unwrap();
    for call in ["run", "read", "write"] {
        let (kind, message) = (&killed[call][0], killed[call][1].as_str().unwrap());
        assert_ne!(kind, "ok", "{call} on a killed sandbox: {killed}");
        assert!(
            message.contains(id) && message.contains("closed"),
            "{call}: the error names the sandbox and that it is closed: {killed}"
        );
    }
    assert_eq!(killed["is_running"], false);
    for call in ["info", "set_timeout", "connect"] {
        not_found(&killed[call], id);
    }
    assert_eq!(killed["kill_again"], false);
    stream_error(&killed["raw_start"], "failed_precondition", "is closed");
    let execute = &killed["raw_execute"];
    assert_eq!(execute["status"], 409, "{killed}");
    assert!(
        execute["body"]["message"]
            .as_str()
            .unwrap()
            .contains("is closed"),
        "{killed}"
    );
}

/// Every refused call left no session execution behind: the sandbox's executions are its
/// agent's commands only; the other tenant's probes are audited as cross-tenant probes and the
/// wrong tokens as authentication failures.
async fn audited(gw: &TestGateway, mine: &str) {
    let pool = gw.pool().await;
    let commands: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM executions WHERE session_id = $1 ORDER BY created_at",
    )
    .bind(mine)
    .fetch_all(&pool)
    .await
    .unwrap();
    // identity, cat, the background sleep (killed), still-fine, alive.
    assert_eq!(
        commands,
        ["succeeded", "succeeded", "killed", "succeeded", "succeeded"],
        "no refused call became an execution"
    );
    let events: Vec<(String, String)> = sqlx::query_as(
        "SELECT kind, reasons::text FROM audit_events \
         WHERE kind IN ('request.cross_tenant', 'auth.failure') ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let seen = |kind: &str, code: &str| {
        events
            .iter()
            .any(|(k, reasons)| k == kind && reasons.contains(code))
    };
    assert!(
        events.iter().any(|(k, _)| k == "request.cross_tenant"),
        "{events:?}"
    );
    assert!(
        seen("auth.failure", "e2b.access_token_invalid"),
        "{events:?}"
    );
    pool.close().await;
}

async fn run_agent(url: &str, agent: &str, other: &str) -> Value {
    run_script(AGENT, url, agent, other).await
}

async fn run_script(script: &'static str, url: &str, agent: &str, other: &str) -> Value {
    let (max_file, max_upload) = (MAX_FILE_BYTES.to_string(), MAX_UPLOAD_BYTES.to_string());
    let extra = [
        ("OTHER_KEY", other),
        ("MAX_FILE", max_file.as_str()),
        ("MAX_UPLOAD", max_upload.as_str()),
    ];
    common::e2b_agent(script, url, agent, &extra).await
}

/// Templates come from the config (`e2b.templates`): a template named there opens a session
/// of its language; any other, the shipped names included when the config drops them, is a 404
/// in E2B's shape naming the configured ones, and opens nothing.
#[tokio::test(flavor = "multi_thread")]
async fn templates_are_the_configured_ones() {
    common::require_docker();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), |config| {
        config.e2b.templates = [("base", "bash"), ("data-science", "python")]
            .into_iter()
            .map(|(name, language)| {
                let template = gateway::config::E2bTemplate {
                    language: language.to_owned(),
                };
                (name.to_owned(), template)
            })
            .collect();
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let create = |template: &'static str| {
        gw.http
            .post(format!("{}/e2b/v2/sandboxes", gw.url))
            .header("x-api-key", &agent)
            .json(&json!({"templateID": template, "timeout": 60}))
            .send()
    };
    for unknown in ["code-interpreter-v1", "nope"] {
        let response = create(unknown).await.unwrap();
        assert_eq!(response.status(), 404, "{unknown}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], 404, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{unknown:?}"))
                && message.contains("(configured: base, data-science)"),
            "{message}"
        );
    }
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&gw.pool().await)
        .await
        .unwrap();
    assert_eq!(sessions, 0, "an unknown template opens nothing");

    let response = create("data-science").await.unwrap();
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.unwrap();
    let id = created["sandboxID"].as_str().unwrap();
    assert_eq!(created["templateID"], "data-science", "{created}");
    let (status, session) = gw.get(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["language"], "python", "{session}");
    let killed = gw
        .http
        .delete(format!("{}/e2b/sandboxes/{id}", gw.url))
        .header("x-api-key", &agent)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status(), 204);
    gw.stop().await;
}

/// The copy's network part, with E2B sandboxes labelled `purpose: review` sent to a reviewer.
const HOLD_RULE: &str = r#"network_part := {"require_approval": true, "reasons": [{"code": "e2b.review", "message": "E2B sandboxes for purpose review need a reviewer"}]} if {
	input.request.kind == "session"
	input.request.labels.purpose == "review"
} else := {"require_approval": false, "reasons": []} if {"#;

/// Asks for a sandbox the policy holds; prints the message of what the SDK raised.
const HELD: &str = r#"
import json
from e2b import Sandbox
try:
    Sandbox.create(template="base", metadata={"purpose": "review"})
    print(json.dumps({"raised": "nothing"}))
except Exception as e:
    print(json.dumps({"raised": type(e).__name__, "message": str(e)}))
"#;

/// Once approved: connects to the held sandbox (its id in OTHER_KEY) and asks where it is.
const APPROVED: &str = r#"
import json, os
from e2b import Sandbox
sbx = Sandbox.connect(os.environ["OTHER_KEY"])
print(json.dumps({"where": sbx.commands.run("whoami; pwd; echo $HOME").stdout.split()}))
sbx.kill()
"#;

/// A held E2B create opens, once a reviewer approves it, in E2B's home as well.
#[tokio::test(flavor = "multi_thread")]
async fn an_approved_e2b_sandbox_starts_in_home_user() {
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
    let said = run_script(HELD, &gw.url, &agent, "").await;
    assert_eq!(said["raised"], "ServiceBusyException", "{said}");
    let message = said["message"].as_str().unwrap();
    let approval = word_after(message, "(approval ");
    let sandbox = word_after(message, "sandbox ");
    let (status, body) = gw
        .post(
            &reviewer,
            &format!("/v1/approvals/{approval}"),
            &json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let said = run_script(APPROVED, &gw.url, &agent, &sandbox).await;
    assert_eq!(
        said["where"],
        json!(["user", "/home/user", "/home/user"]),
        "{said}"
    );
    gw.stop().await;
}

/// The word after `marker` in `text` (up to a space, `)` or `:`).
fn word_after(text: &str, marker: &str) -> String {
    let rest = &text[text.find(marker).unwrap() + marker.len()..];
    rest.split([' ', ')', ':']).next().unwrap().to_owned()
}
