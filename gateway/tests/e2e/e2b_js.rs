//! E2B's JS SDK (`e2b` and `@e2b/code-interpreter` from npm, pinned by scripts/setup.sh into
//! `target/js`) against sandgate through the real stack, as a Node agent platform runs it:
//! create, `commands.run`, `runCode` with state across cells and in a context, files written
//! and read back, kill; each command and cell recorded as a session execution.

use std::path::PathBuf;
use std::process::Command;

use crate::common;

use common::TestGateway;

/// The JS SDKs' directory (scripts/setup.sh makes it with npm).
fn js_dir() -> PathBuf {
    let dir = std::env::var_os("SANDGATE_JS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::workspace_root().join("target/js"));
    assert!(
        dir.join("node_modules/@e2b/code-interpreter/package.json")
            .is_file(),
        "no E2B JS SDK at {}: run `bash scripts/setup.sh` (it installs e2b and \
         @e2b/code-interpreter with npm, and needs Node 20.18.1 or newer)",
        dir.display()
    );
    dir
}

/// What the agent platform does, with E2B's JS SDK. Prints one JSON line with what it saw.
const AGENT: &str = r#"
const { Sandbox } = require('@e2b/code-interpreter');
(async () => {
  const out = {};
  const sbx = await Sandbox.create({ timeoutMs: 120000 });
  out.id = sbx.sandboxId;
  const r = await sbx.commands.run('echo hello from js; whoami; pwd');
  out.command = [r.stdout, r.exitCode];
  out.first = (await sbx.runCode('x = 20\nx * 2 + 2')).text;
  out.state = (await sbx.runCode('x')).text;
  const err = (await sbx.runCode('1 / 0')).error;
  out.error = err ? err.name : null;
  await sbx.files.write('/home/user/js.txt', 'written by js');
  out.read = await sbx.files.read('/home/user/js.txt');
  const ctx = await sbx.createCodeContext({ language: 'python' });
  await sbx.runCode('x = "in the context"', { context: ctx });
  out.context = [(await sbx.runCode('x', { context: ctx })).text, (await sbx.runCode('x')).text];
  await sbx.kill();
  out.running = await sbx.isRunning();
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

async fn js_agent(script: &str, url: &str, agent: &str) -> serde_json::Value {
    let modules = js_dir().join("node_modules");
    let e2b = format!("{url}/e2b");
    let (script, agent) = (script.to_owned(), agent.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(["-e", &script])
            .env("NODE_PATH", modules)
            .env("E2B_API_URL", &e2b)
            .env("E2B_SANDBOX_URL", &e2b)
            .env("E2B_API_KEY", agent)
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG")
            .output()
            .expect("running node (the machine's, 18 or later)")
    })
    .await
    .expect("the agent's task");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the JS agent failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|err| panic!("{err}: {stdout}\n{stderr}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_e2b_js_sdk_creates_runs_code_and_files_and_kills() {
    common::require_docker();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), |_| {}).await;
    let agent = gw.key("agent", "acme").await;
    let said = js_agent(AGENT, &gw.url, &agent).await;
    eprintln!("the JS agent saw: {said:#}");
    assert_eq!(
        said["command"],
        serde_json::json!(["hello from js\nuser\n/home/user\n", 0])
    );
    assert_eq!(said["first"], "42");
    assert_eq!(said["state"], "20", "state carries from cell to cell");
    assert_eq!(said["error"], "ZeroDivisionError");
    assert_eq!(said["read"], "written by js");
    assert_eq!(
        said["context"],
        serde_json::json!(["in the context", "20"]),
        "a context's state is its own"
    );
    assert_eq!(said["running"], false);

    let pool = gw.pool().await;
    let calls: Vec<(Option<String>, String)> = sqlx::query_as(
        "SELECT a.input -> 'request' -> 'e2b' ->> 'call', e.status FROM audit_events a \
         JOIN executions e ON e.id = a.execution_id WHERE e.session_id = $1 \
         AND a.kind = 'execution.decision' ORDER BY e.created_at",
    )
    .bind(said["id"].as_str().unwrap())
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected: Vec<(Option<String>, String)> = [
        ("commands.run", "succeeded"),
        ("run_code", "succeeded"),
        ("run_code", "succeeded"),
        ("run_code", "failed"),
        ("run_code", "succeeded"),
        ("run_code", "succeeded"),
        ("run_code", "succeeded"),
    ]
    .iter()
    .map(|(call, status)| (Some((*call).to_owned()), (*status).to_owned()))
    .collect();
    assert_eq!(
        calls, expected,
        "each command and cell decided and recorded"
    );
    pool.close().await;
    gw.stop().await;
}
