//! Sessions through the real stack (DESIGN 10): the gateway, PostgreSQL, dockerd + runsc and
//! the static sandbox-init's session runner.

use crate::common;

use std::time::Duration;

use common::TestGateway;
use serde_json::{json, Value};

async fn open(gw: &TestGateway, key: &str, body: Value) -> String {
    let (status, session) = gw.post(key, "/v1/sessions", &body).await;
    assert_eq!(status, 201, "{session}");
    assert_eq!(session["status"], "ready");
    session["id"].as_str().unwrap().to_owned()
}

async fn run(gw: &TestGateway, key: &str, id: &str, body: Value) -> (u16, Value) {
    gw.post(key, &format!("/v1/sessions/{id}/executions"), &body)
        .await
}

#[tokio::test]
async fn python_state_files_and_imports_persist_and_other_tenants_see_nothing() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, json!({"language": "python"})).await;

    let (status, first) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "x = 41\nimport pandas as pd"}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(first["session_id"], id.as_str());
    let (_, second) = run(&gw, &agent, &id, json!({"code": "x + 1"})).await;
    assert_eq!(second["result"], "42", "{second}");
    let (_, wrote) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "open('/workspace/t.csv', 'w').write('a\\n1\\n2\\n')"}),
    )
    .await;
    assert_eq!(wrote["status"], "succeeded", "{wrote}");
    let (_, read) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "int(pd.read_csv('t.csv')['a'].sum())"}),
    )
    .await;
    assert_eq!(read["result"], "3", "{read}");

    // /output is collected after each execution, without a symlink or a hardlink.
    let (_, left) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "import os\nopen('/output/a.txt', 'w').write('hi')\n\
os.symlink('/etc/passwd', '/output/pw')\nopen('/output/h1', 'w').write('x')\n\
os.link('/output/h1', '/output/h2')"}),
    )
    .await;
    assert_eq!(left["status"], "succeeded", "{left}");
    assert_eq!(left["outputs"].as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left["outputs"][0]["path"], "a.txt", "{left}");
    let reasons: Vec<(&str, &str)> = left["outputs_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["path"].as_str().unwrap(), s["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        reasons,
        [("h1", "hardlink"), ("h2", "hardlink"), ("pw", "symlink")],
        "{left}"
    );
    let exec_id = left["id"].as_str().unwrap();
    let (status, bytes, _) = gw.download(&agent, exec_id, "a.txt").await;
    assert_eq!((status, bytes.as_slice()), (200, &b"hi"[..]));

    // Another tenant's agent: 404 on every route, and its listing does not show it.
    let other = gw.key("agent", "forge").await;
    assert_eq!(gw.get(&other, &format!("/v1/sessions/{id}")).await.0, 404);
    assert_eq!(run(&gw, &other, &id, json!({"code": "x"})).await.0, 404);
    assert_eq!(
        gw.delete(&other, &format!("/v1/sessions/{id}")).await.0,
        404
    );
    let (_, listed) = gw.get(&other, "/v1/sessions").await;
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let (_, mine) = gw.get(&agent, "/v1/sessions").await;
    assert_eq!(mine["sessions"][0]["id"], id.as_str());

    // A timeout interrupts the cell; the session goes on, state intact.
    let (_, spun) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "while True:\n    pass", "limits": {"timeout_ms": 1000}}),
    )
    .await;
    assert_eq!(spun["status"], "timeout", "{spun}");
    let (_, alive) = run(&gw, &agent, &id, json!({"code": "print('alive')\nx"})).await;
    assert_eq!(alive["stdout"], "alive\n", "{alive}");
    assert_eq!(alive["result"], "41");

    // A denied execution runs nothing, and the session stays usable.
    let (status, denied) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "x = 0", "limits": {"timeout_ms": 0}}),
    )
    .await;
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["error"]["code"], "policy_denied", "{denied}");
    let (_, still) = run(&gw, &agent, &id, json!({"code": "x"})).await;
    assert_eq!(still["result"], "41", "{still}");
    assert_eq!(gw.session(&agent, &id).await["executions"], 8);

    // Closing removes the sandbox.
    let container = gw.session(&agent, &id).await["container"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(common::container_exists(&container));
    let (status, closed) = gw.delete(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["status"], "closed");
    assert_eq!(closed["closed_reason"], "deleted");
    assert!(!common::container_exists(&container));
    assert_eq!(run(&gw, &agent, &id, json!({"code": "x"})).await.0, 409);
    gw.stop().await;
}

#[tokio::test]
async fn one_execution_at_a_time_and_classroom_may_not_open_sessions() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, json!({"language": "python"})).await;
    let slow = run(
        &gw,
        &agent,
        &id,
        json!({"code": "import time\ntime.sleep(3)\n'slept'"}),
    );
    let second = async {
        common::eventually(
            Duration::from_secs(30),
            "the first run is running",
            || async { gw.session(&agent, &id).await["status"] == "busy" },
        )
        .await;
        run(&gw, &agent, &id, json!({"code": "1"})).await
    };
    let ((_, slow), (status, busy)) = tokio::join!(slow, second);
    assert_eq!(status, 409, "{busy}");
    assert_eq!(slow["result"], "'slept'", "{slow}");

    // A cancel interrupts the running code; the session goes on.
    let spin = run(&gw, &agent, &id, json!({"code": "while True:\n    pass"}));
    let cancel = async {
        for _ in 0..100 {
            let (_, listed) = gw.get(&agent, "/v1/executions?status=running").await;
            if let Some(running) = listed["executions"][0]["id"].as_str() {
                let path = format!("/v1/executions/{running}/cancel");
                return gw.post(&agent, &path, &json!({})).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the session execution never ran");
    };
    let ((_, spun), (status, _)) = tokio::join!(spin, cancel);
    assert_eq!(status, 200);
    assert_eq!(spun["status"], "cancelled", "{spun}");
    let (_, after) = run(&gw, &agent, &id, json!({"code": "'still here'"})).await;
    assert_eq!(after["result"], "'still here'", "{after}");

    let student = gw.key("agent", "classroom").await;
    let (status, denied) = gw
        .post(&student, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 403, "{denied}");
    assert_eq!(
        denied["error"]["reasons"][0]["code"], "session.not_allowed",
        "{denied}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn bash_sessions_keep_cwd_variables_and_functions() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, json!({"language": "bash"})).await;
    let (_, first) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "cd /tmp; export A=1; f() { echo fn; }"}),
    )
    .await;
    assert_eq!(first["status"], "succeeded", "{first}");
    let (_, second) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "pwd; echo $A; f; exit_code() { return 3; }; exit_code"}),
    )
    .await;
    assert_eq!(second["stdout"], "/tmp\n1\nfn\n", "{second}");
    assert_eq!(second["exit_code"], 3);
    assert_eq!(second["status"], "failed");

    // `sandgate exec --session`: the client runs in the open session, exits with its code.
    let request = gateway::client::ExecRequest {
        url: gw.url.clone(),
        key: agent.clone(),
        language: "bash".into(),
        code: "echo $A from $(pwd); exit_code".into(),
        files: vec![],
        network: vec![],
        mounts: vec![],
        timeout_ms: None,
        output_dir: None,
        session: Some(id.clone()),
        tls: Default::default(),
        save: Default::default(),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = gateway::client::exec(&request, &mut out, &mut err)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "1 from /tmp\n");
    assert_eq!(code, 3, "{}", String::from_utf8_lossy(&err));
    gw.stop().await;
}

#[tokio::test]
async fn an_oom_closes_the_session() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let id = open(
        &gw,
        &agent,
        json!({"language": "python", "limits": {"memory_mb": 128}}),
    )
    .await;
    let (_, hog) = run(
        &gw,
        &agent,
        &id,
        json!({"code": "b = []\nwhile True:\n    b.append(bytearray(16 << 20))"}),
    )
    .await;
    assert_eq!(hog["status"], "oom", "{hog}");
    let closed = gw.session(&agent, &id).await;
    assert_eq!(closed["status"], "closed");
    assert_eq!(closed["closed_reason"], "oom");
    assert!(!common::container_exists(
        closed["container"].as_str().unwrap()
    ));
    gw.stop().await;
}

#[tokio::test]
async fn idle_expiry_closes_the_session_and_removes_its_sandbox() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let id = open(
        &gw,
        &agent,
        json!({"language": "bash", "idle_timeout_s": 1}),
    )
    .await;
    let container = gw.session(&agent, &id).await["container"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut closed = Value::Null;
    for _ in 0..100 {
        closed = gw.session(&agent, &id).await;
        if closed["status"] == "closed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(closed["closed_reason"], "idle", "{closed}");
    assert!(!common::container_exists(&container));
    gw.stop().await;
}

#[tokio::test]
async fn a_shutdown_closes_open_sessions_and_removes_their_containers() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url.clone()), |_| {}).await;
    let agent = gw.key("agent", "acme").await;
    let ids = [
        open(&gw, &agent, json!({"language": "python"})).await,
        open(&gw, &agent, json!({"language": "bash"})).await,
    ];
    let mut containers = Vec::new();
    for id in &ids {
        containers.push(
            gw.session(&agent, id).await["container"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let data = gw.stop_keeping_data().await;
    let gw = TestGateway::start_in(Some(url), data, |_| {}).await;
    for (id, container) in ids.iter().zip(&containers) {
        let mut closed = Value::Null;
        for _ in 0..100 {
            closed = gw.session(&agent, id).await;
            if closed["status"] == "closed" && !common::container_exists(container) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(closed["closed_reason"], "gateway_restart", "{closed}");
        assert!(
            !common::container_exists(container),
            "{container} left behind"
        );
    }
    gw.stop().await;
}

/// A session's grant is decided when it opens and served on its socket for its whole life:
/// every connection row names the session, and the execution running when it opened (none for
/// a background thread's connection between executions).
#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_connections_name_the_session_and_the_execution_running() {
    use common::egress::{bundle_with_test_tenant, gateway_with, upstream, UPSTREAM};
    let upstream = upstream();
    let port = upstream.port;
    let policies = bundle_with_test_tenant(&[("files.test", port)]);
    let gw = gateway_with(policies.path(), &[("files.test", UPSTREAM)]).await;
    let agent = gw.key("agent", "nettest").await;
    let id = open(
        &gw,
        &agent,
        json!({"language": "python", "network": [{"host": "files.test", "port": port}]}),
    )
    .await;
    let code = format!(
        r#"
import threading, time, urllib.request
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    except Exception as e:
        return "refused: " + str(getattr(e, "code", e))
later = {{}}
def in_the_background():
    time.sleep(1.5)
    later["body"] = fetch("http://files.test:{port}/hello.txt")
threading.Thread(target=in_the_background).start()
[fetch("http://files.test:{port}/hello.txt"), fetch("http://evil.example:{port}/")]
"#
    );
    let (status, first) = run(&gw, &agent, &id, json!({"code": code})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "succeeded", "{first}");
    let result = first["result"].as_str().unwrap();
    assert!(result.contains("hello through the proxy"), "{result}");
    assert!(result.contains("refused: 403"), "{result}");
    let db = gw.pool().await;
    // The background fetch is over once the proxy closed its connection (the one opened
    // between executions); only then may the next execution start.
    common::eventually(
        Duration::from_secs(30),
        "the background fetch is over",
        || async {
            let closed: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM egress_connections WHERE session_id = $1 \
             AND execution_id IS NULL AND closed_at IS NOT NULL",
            )
            .bind(&id)
            .fetch_one(&db)
            .await
            .unwrap();
            closed == 1
        },
    )
    .await;
    let (_, second) = run(&gw, &agent, &id, json!({"code": "later.get('body')"})).await;
    assert!(
        second["result"]
            .as_str()
            .unwrap()
            .contains("hello through the proxy"),
        "{second}"
    );

    let rows: Vec<(Option<String>, String, bool)> = sqlx::query_as(
        "SELECT execution_id, host, allow FROM egress_connections WHERE session_id = $1 \
         ORDER BY opened_at",
    )
    .bind(&id)
    .fetch_all(&db)
    .await
    .unwrap();
    let first_id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(
        rows,
        vec![
            (Some(first_id.clone()), "files.test".to_owned(), true),
            (Some(first_id), "evil.example".to_owned(), false),
            (None, "files.test".to_owned(), true),
        ],
        "each row names the execution running when it opened"
    );
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'egress.connection' \
         AND input->>'session_id' = $1",
    )
    .bind(&id)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(events, 3, "one audit event per attempt, naming the session");
    let (status, _) = gw.delete(&agent, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200);
    gw.stop().await;
}

/// A session execution has the usual events stream: `wait: false` answers 202 as the turn
/// starts, the output arrives while it runs, the stream ends with the stored record's end.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_execution_streams_its_output_while_it_runs() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let id = open(&gw, &agent, json!({"language": "python"})).await;
    let code = "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')\n6 * 7";
    let (status, started) = run(&gw, &agent, &id, json!({"code": code, "wait": false})).await;
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["status"], "running", "{started}");
    assert_eq!(started["session_id"], id.as_str(), "{started}");
    let execution = started["id"].as_str().unwrap().to_owned();
    let mut reader = gw.events(&agent, &execution).await;
    let mut events = Vec::new();
    let mut stdout = String::new();
    while !stdout.contains('\n') {
        let event = reader.next().await.expect("the first line");
        assert_eq!(event.name, "stdout", "{event:?}");
        stdout.push_str(event.data["text"].as_str().unwrap_or_default());
        events.push(event);
    }
    assert_eq!(stdout, "first\n");
    let (busy, _) = run(&gw, &agent, &id, json!({"code": "1"})).await;
    assert_eq!(busy, 409, "one execution at a time, also while it streams");
    events.extend(reader.collect().await);
    let last = events.last().unwrap();
    assert_eq!(last.name, "exit", "{events:?}");
    let (_, record) = gw.get(&agent, &format!("/v1/executions/{execution}")).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["stdout"], "first\nsecond\n", "{record}");
    assert_eq!(record["result"], "42", "{record}");
    assert_eq!(last.data["status"], record["status"]);
    gw.stop().await;
}
