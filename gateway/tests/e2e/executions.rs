//! End to end through the HTTP API: real PostgreSQL, real dockerd, real runsc.

use crate::common;

use std::time::Instant;

use serde_json::{json, Value};

use common::{containers_created_since, TestGateway};

#[tokio::test(flavor = "multi_thread")]
async fn python_and_bash_run_in_gvisor_and_read_back() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;

    let (status, body) = gw.execute(&key, "python", "print(6*7)", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stdout"], "42\n");
    assert!(body["duration_ms"].as_i64().unwrap() > 0, "{body}");
    let decision = &body["decision"];
    assert_eq!(decision["allow"], true);
    assert_eq!(decision["backend"], "gvisor");
    assert!(decision["id"].as_str().unwrap().starts_with("dc_"));
    assert!(decision["policy_revision"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(decision["reasons"].is_array());
    let id = body["id"].as_str().unwrap();
    assert!(common::removed_soon(id), "container left behind");

    let (status, mut again) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(status, 200);
    // GET adds what the review page's detail view reads from the decision event.
    assert_eq!(again["files"], json!([]), "{again}");
    assert_eq!(again["grant"]["network"], Value::Null, "{again}");
    let fields = again.as_object_mut().unwrap();
    fields.remove("files");
    fields.remove("grant");
    assert_eq!(again, body, "GET returns the same record");

    let (status, body) = gw
        .execute(
            &key,
            "bash",
            "echo \"hello from $(basename $BASH)\"",
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    assert_eq!(body["stdout"], "hello from bash\n");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_program_reports_exit_code_and_stderr() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let code = "import sys\nprint('about to fail')\nsys.stderr.write('boom\\n')\nsys.exit(3)";
    let (status, body) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    assert_eq!(body["exit_code"], 3);
    assert_eq!(body["stdout"], "about to fail\n");
    assert_eq!(body["stderr"], "boom\n");

    let (_, body) = gw
        .execute(&key, "python", "raise ValueError('bad input')", json!({}))
        .await;
    assert_eq!(body["status"], "failed");
    assert_eq!(body["exit_code"], 1);
    assert!(
        body["stderr"]
            .as_str()
            .unwrap()
            .contains("ValueError: bad input"),
        "{body}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn infinite_loop_times_out_and_leaves_no_container() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let started = Instant::now();
    let (status, body) = gw
        .execute(
            &key,
            "python",
            "while True: pass",
            json!({"limits": {"timeout_ms": 2000}}),
        )
        .await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "timeout", "{body}");
    assert_eq!(body["exit_code"], json!(null));
    assert_eq!(body["limits"]["timeout_ms"], 2000);
    // Generous bound: the point is "a few seconds", not "until the 30 s tenant limit".
    assert!(elapsed.as_secs() < 15, "took {elapsed:?}");
    let id = body["id"].as_str().unwrap();
    assert!(common::removed_soon(id), "container left behind");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_is_gvisor_read_only_unprivileged_and_clean() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let code = r#"
import os, json
facts = {}
facts["kernel"] = open("/proc/version").read()
try:
    open("/etc/x", "w").write("x")
    facts["etc_write"] = "succeeded"
except OSError as err:
    facts["etc_write"] = type(err).__name__
facts["uid"] = os.getuid()
facts["gid"] = os.getgid()
facts["uids"] = list(os.getresuid())
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
facts["caps"] = {name: status.get(name, "").strip() for name in ("CapEff", "CapPrm", "CapInh", "CapAmb")}
import ctypes
facts["no_new_privs"] = ctypes.CDLL(None).prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
facts["env"] = dict(os.environ)
facts["cwd"] = os.getcwd()
open("/workspace/ok.txt", "w").write("writable")
open("/tmp/ok.txt", "w").write("writable")
facts["interfaces"] = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None
print(json.dumps(facts))
"#;
    let (status, body) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let facts: serde_json::Value = serde_json::from_str(body["stdout"].as_str().unwrap()).unwrap();
    assert!(
        facts["kernel"].as_str().unwrap().contains("gVisor") || dmesg_is_gvisor(&gw, &key).await,
        "not gVisor: {facts}"
    );
    assert_ne!(facts["etc_write"], "succeeded", "{facts}");
    assert_ne!(facts["uid"], 0);
    assert_ne!(facts["gid"], 0);
    // The container starts as root for the init alone (it leaves uid 0 before the program):
    // the program holds no uid 0 and no capability of any kind.
    assert_eq!(facts["uids"], json!([65534, 65534, 65534]), "{facts}");
    for (name, value) in facts["caps"].as_object().unwrap() {
        assert!(
            value.as_str().unwrap().trim_start_matches('0').is_empty(),
            "{name} = {value}: {facts}"
        );
    }
    assert_eq!(facts["no_new_privs"], 1, "{facts}");
    assert_eq!(facts["cwd"], "/workspace");
    let env = facts["env"].as_object().unwrap();
    let names: Vec<&String> = env.keys().collect();
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "MPLBACKEND",
        "PYTHONUSERBASE",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        // Every sandbox has the proxy (issue 21 item 11); without a grant it refuses all.
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ];
    for name in &names {
        assert!(
            allowed.contains(&name.as_str()),
            "unexpected variable {name} in {env:?}"
        );
    }
    gw.stop().await;
}

/// gVisor's `dmesg` starts with "Starting gVisor...".
async fn dmesg_is_gvisor(gw: &TestGateway, key: &str) -> bool {
    let (_, body) = gw
        .execute(key, "bash", "dmesg 2>&1 | head -3", json!({}))
        .await;
    body["stdout"].as_str().unwrap_or("").contains("gVisor")
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_denials_are_403_with_reasons_and_run_nothing() {
    let gw = TestGateway::start().await;
    let since = common::docker_now();

    let stranger = gw.key("agent", "nosuch").await;
    let (status, body) = gw.execute(&stranger, "python", "print(1)", json!({})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "policy_denied");
    let reasons = body["error"]["reasons"].as_array().unwrap();
    assert!(
        reasons.iter().any(|r| r["code"] == "tenant.unknown"),
        "{body}"
    );
    let unknown_tenant = body["error"]["execution_id"].as_str().unwrap().to_owned();

    let key = gw.key("agent", "acme").await;
    let (status, body) = gw.execute(&key, "cobol", "DISPLAY 'HI'.", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let reasons = body["error"]["reasons"].as_array().unwrap();
    assert!(
        reasons.iter().any(|r| r["code"] == "language.not_allowed"),
        "{body}"
    );
    let bad_language = body["error"]["execution_id"].as_str().unwrap().to_owned();

    for id in [&unknown_tenant, &bad_language] {
        let label = format!("sandgate.execution={id}");
        assert!(
            containers_created_since(&since, &label).is_empty(),
            "{id} created a container"
        );
        let (status, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
        if id == &bad_language {
            assert_eq!(status, 200);
            assert_eq!(record["status"], "denied");
            assert_eq!(record["decision"]["allow"], false);
        } else {
            assert_eq!(status, 404, "another tenant's execution is not visible");
        }
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_are_audited_before_and_after() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (_, allowed) = gw.execute(&key, "bash", "true", json!({})).await;
    let (_, denied) = gw.execute(&key, "cobol", "x", json!({})).await;
    let allowed_id = allowed["id"].as_str().unwrap();
    let denied_id = denied["error"]["execution_id"].as_str().unwrap();

    let pool = gw.pool().await;
    for (id, allow, status) in [
        (allowed_id, true, "succeeded"),
        (denied_id, false, "denied"),
    ] {
        let (row_status, revision): (String, String) =
            sqlx::query_as("SELECT status, policy_revision FROM executions WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(row_status, status);
        let events: Vec<(String, Option<bool>, Option<String>, serde_json::Value)> = sqlx::query_as(
            "SELECT kind, allow, policy_revision, input FROM audit_events WHERE execution_id = $1",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(
            events.len(),
            1,
            "one decision event per execution: {events:?}"
        );
        assert_eq!(events[0].0, "execution.decision");
        assert_eq!(events[0].1, Some(allow));
        assert_eq!(events[0].2.as_deref(), Some(revision.as_str()));
        assert_eq!(events[0].3["principal"]["tenant"], "acme");
        // The stored input names the code by hash; the code itself is not in the audit row.
        assert!(events[0].3["request"]["code_sha256"].is_string());
    }
    // The chain links each event to the previous one.
    let links: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT seq, prev_hash, hash FROM audit_events ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    for pair in links.windows(2) {
        assert_eq!(pair[1].0, pair[0].0 + 1);
        assert_eq!(pair[1].1, pair[0].2);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_wrong_keys_get_401_and_are_audited() {
    let gw = TestGateway::start().await;
    let body = json!({"language": "python", "code": "print(1)"});
    let response = gw
        .http
        .post(format!("{}/v1/executions", gw.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let error: serde_json::Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "unauthenticated");
    assert!(error["error"]["message"].is_string());

    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("no API key"), "{message}");

    let forged = format!("sgk_0123456789abcdef_{}", "0".repeat(64));
    let (status, error) = gw.post(&forged, "/v1/executions", &body).await;
    assert_eq!(status, 401);
    assert_eq!(error["error"]["code"], "unauthenticated");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("key_0123456789abcdef is not known"),
        "{message}"
    );

    let (status, error) = gw.post("sgk_0123_short", "/v1/executions", &body).await;
    assert_eq!(status, 401);
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("malformed"), "{message}");

    let pool = gw.pool().await;
    let failures: Vec<(serde_json::Value,)> =
        sqlx::query_as("SELECT input FROM audit_events WHERE kind = 'auth.failure' ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(failures.len(), 3, "{failures:?}");
    assert_eq!(failures[1].0["claimed_key_id"], "key_0123456789abcdef");
    let codes: Vec<(String,)> = sqlx::query_as(
        "SELECT reasons->0->>'code' FROM audit_events WHERE kind = 'auth.failure' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let codes: Vec<&str> = codes.iter().map(|(code,)| code.as_str()).collect();
    assert_eq!(
        codes,
        ["auth.missing_key", "auth.unknown_key", "auth.malformed_key"]
    );
    let stored = serde_json::to_string(&failures).unwrap();
    assert!(
        !stored.contains(&forged),
        "the presented secret must not be stored"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_use_the_error_shape() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, body) = gw
        .post(&key, "/v1/executions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");

    let response = gw
        .http
        .post(format!("{}/v1/executions", gw.url))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(r#"{"language":"python","code":"print(1)","code":"print(2)"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        400,
        "duplicate keys are refused"
    );

    let huge = "x".repeat(gateway::api::MAX_BODY_BYTES + 1);
    let (status, body) = gw
        .post(
            &key,
            "/v1/executions",
            &json!({"language": "python", "code": huge}),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("32 MiB"),
        "the 413 states the limit: {message}"
    );

    // Messages say what to fix, in the request's words, never in Rust's.
    for (request, wanted) in [
        (
            json!({"language": "python", "code": "1", "limits": {"timeout": 5000}}),
            ["limits", "`timeout`", "timeout_ms"],
        ),
        (
            json!({"language": "python", "code": "1", "network": ["pypi.org:443"]}),
            ["network[0]", "an object", "request body"],
        ),
        (
            json!({"language": "python", "code": "1",
                   "files": [{"path": "a.txt", "content_b64": "not base64!"}]}),
            ["a.txt", "not base64", "' '"],
        ),
    ] {
        let (status, body) = gw.post(&key, "/v1/executions", &request).await;
        assert_eq!(status, 400, "{request}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        for word in wanted {
            assert!(message.contains(word), "{request}: {message} lacks {word}");
        }
        for rust in ["struct", "HostPort", "Invalid symbol", "usize", "u64"] {
            assert!(!message.contains(rust), "{request}: {message}");
        }
    }

    let (status, body) = gw.get(&key, "/v1/executions/ex_nope").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "not_found");

    // A caller who may not call the route is refused before its body is read.
    let reviewer = gw.key("reviewer", "acme").await;
    let response = gw
        .http
        .post(format!("{}/v1/executions", gw.url))
        .bearer_auth(&reviewer)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    // A known path with the wrong method: 405 in the error shape.
    let response = gw
        .http
        .delete(format!("{}/v1/executions", gw.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 405);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_checks_every_dependency() {
    let gw = TestGateway::start().await;
    let response = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    for check in [
        "docker",
        "runtime:runsc",
        "postgres",
        "policy",
        "sandbox_init",
    ] {
        assert_eq!(body["checks"][check]["ok"], true, "{check}: {body}");
    }
    gw.stop().await;

    // A broken policy bundle: not ready, and says which part is missing.
    let empty = tempfile::tempdir().unwrap();
    let url = common::fresh_database().await;
    let dir = empty.path().to_owned();
    let gw = TestGateway::start_with(Some(url), move |config| config.policy_dir = dir).await;
    let response = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["missing"], json!(["policy"]), "{body}");
    let key = gw.key("agent", "acme").await;
    let (status, body) = gw.execute(&key, "python", "print(1)", json!({})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["reasons"][0]["code"], "policy.error");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_false_returns_202_and_completes_in_the_background() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, body) = gw
        .execute(&key, "bash", "sleep 1; echo done", json!({"wait": false}))
        .await;
    assert_eq!(status, 202, "{body}");
    assert!(
        ["queued", "running"].contains(&body["status"].as_str().unwrap()),
        "{body}"
    );
    let id = body["id"].as_str().unwrap();
    let mut last = body.clone();
    for _ in 0..300 {
        let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
        last = record;
        if last["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_eq!(last["stdout"], "done\n");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn datasets_are_mounted_read_only() {
    let dataset = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dataset.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let csv = dataset.path().join("people.csv");
    std::fs::write(&csv, "name,age\nada,36\ngrace,45\n").unwrap();
    let before = std::fs::read(&csv).unwrap();
    let gw = TestGateway::start_with_census(dataset.path()).await;
    let key = gw.key("agent", "acme").await;
    let code = r#"
import csv, os
rows = list(csv.DictReader(open("/data/census/people.csv")))
print(sum(int(r["age"]) for r in rows))
for attempt in ("/data/census/people.csv", "/data/census/new.csv"):
    try:
        open(attempt, "a").write("mallory,1\n")
        print("wrote", attempt)
    except OSError as err:
        print("refused", type(err).__name__)
os.makedirs("/output", exist_ok=True)
open("/output/total.txt", "w").write("81")
"#;
    let (status, body) = gw
        .execute(&key, "python", code, json!({"mounts": ["dataset:census"]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("81\n"), "{stdout}");
    assert!(!stdout.contains("wrote"), "{stdout}");
    assert_eq!(stdout.matches("refused").count(), 2, "{stdout}");
    assert_eq!(
        std::fs::read(&csv).unwrap(),
        before,
        "the host copy changed"
    );
    assert!(!dataset.path().join("new.csv").exists());

    // A dataset the gateway does not have is refused, and nothing runs.
    let (status, body) = gw
        .execute(
            &key,
            "python",
            "print(1)",
            json!({"mounts": ["dataset:secret"]}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_the_sandbox_within_a_second() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, body) = gw
        .execute(
            &key,
            "bash",
            "echo started; sleep 30",
            json!({"wait": false}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    // Running once its first line is in the record (cold or warm: a pooled sandbox carries no
    // execution label to look for).
    for _ in 0..200 {
        let (_, so_far) = gw.get(&key, &format!("/v1/executions/{id}")).await;
        if so_far["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("started")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let (status, record) = gw
        .post(&key, &format!("/v1/executions/{id}/cancel"), &json!({}))
        .await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "cancelled", "{record}");
    // Measured, loosely bounded: the point is "about a second", not "the 30 s sleep".
    assert!(took.as_secs() < 10, "cancel took {took:?}");
    assert!(common::removed_soon(&id), "container left behind");
    let (status, again) = gw
        .post(&key, &format!("/v1/executions/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["error"]["code"], "conflict");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_bomb_ends_as_oom_and_output_flood_is_capped() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 1024 * 1024))";
    let (status, body) = gw
        .execute(&key, "python", bomb, json!({"limits": {"memory_mb": 128}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "oom", "{body}");

    let flood = "yes sandgate | head -c 50000000; echo done >&2";
    let (status, body) = gw
        .execute(
            &key,
            "bash",
            flood,
            json!({"limits": {"output_bytes": 65536}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    assert_eq!(body["stdout"].as_str().unwrap().len(), 65536);
    assert_eq!(body["stdout_truncated"], true);
    assert_eq!(body["stderr"], "done\n");
    assert_eq!(body["stderr_truncated"], false);
    gw.stop().await;
}
