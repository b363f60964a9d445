//! Orchestration logic with a fake container runtime (the one seam where a fake is allowed) and
//! a real PostgreSQL. No isolation property is shown here; `executions.rs` does that for real.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use gateway::audit::AuditStore;
use gateway::runtime::{
    CappedOutput, Ending, Job, Owner, Ran, RunControl, RuntimeError, RuntimeHealth, Sandbox,
    SandboxInfo, SandboxPlan, SandboxRuntime,
};

/// What the fake was asked to run: the sandbox's plan and, once handed over, its job.
type Run = (SandboxPlan, Option<Job<'static>>);

/// A runtime that records what it was asked to run and answers from a script. Its containers
/// exist only as entries in `containers` (left-overs a test plants for the reaper).
#[derive(Default)]
struct FakeRuntime {
    runs: AtomicUsize,
    specs: Arc<Mutex<Vec<Run>>>,
    containers: Mutex<Vec<SandboxInfo>>,
    fail: bool,
    /// When set, each run waits for a permit: the test decides when sandboxes finish.
    gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Pooled sandboxes end shortly after they said they were ready.
    pooled_die: bool,
}

#[derive(Debug)]
struct FakeSandbox {
    name: String,
    index: usize,
    specs: Arc<Mutex<Vec<Run>>>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    dies: bool,
}

impl Sandbox for FakeSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn closed(&mut self) -> BoxFuture<'_, ()> {
        if self.dies {
            return tokio::time::sleep(Duration::from_millis(50)).boxed();
        }
        futures_util::future::pending().boxed()
    }

    fn run(
        &mut self,
        job: Job<'static>,
        _control: RunControl,
    ) -> BoxFuture<'_, Result<Ran, RuntimeError>> {
        async move {
            self.specs.lock().unwrap()[self.index].1 = Some(job);
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            Ok(Ran {
                ending: Ending::Exited(0),
                settled: true,
                special_files: Vec::new(),
                stdout: CappedOutput {
                    bytes: b"fake\n".to_vec(),
                    truncated: false,
                },
                stderr: CappedOutput::default(),
                started_at: gateway::ids::now_micros(),
                duration: Duration::from_millis(5),
            })
        }
        .boxed()
    }

    fn discard(self: Box<Self>) -> BoxFuture<'static, ()> {
        async {}.boxed()
    }
}

impl SandboxRuntime for FakeRuntime {
    fn start(&self, plan: SandboxPlan) -> BoxFuture<'_, Result<Box<dyn Sandbox>, RuntimeError>> {
        async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Err(RuntimeError::Docker {
                    operation: "create container",
                    message: "secret daemon detail".to_owned(),
                });
            }
            let name = plan.container_name();
            let dies = self.pooled_die && matches!(plan.owner, Owner::Pool { .. });
            let mut specs = self.specs.lock().unwrap();
            specs.push((plan, None));
            Ok(Box::new(FakeSandbox {
                name,
                index: specs.len() - 1,
                specs: Arc::clone(&self.specs),
                gate: self.gate.clone(),
                dies,
            }) as Box<dyn Sandbox>)
        }
        .boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, RuntimeError>> {
        async move { Ok(self.containers.lock().unwrap().clone()) }.boxed()
    }

    fn destroy<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>> {
        async move {
            self.containers
                .lock()
                .unwrap()
                .retain(|c| c.container_id != container_id);
            Ok(())
        }
        .boxed()
    }

    fn health<'a>(&'a self, runtimes: &'a [String]) -> BoxFuture<'a, RuntimeHealth> {
        async move {
            RuntimeHealth {
                docker: Ok("fake".to_owned()),
                runtimes: runtimes.iter().map(|r| (r.clone(), true)).collect(),
            }
        }
        .boxed()
    }
}

struct Harness {
    url: String,
    db: String,
    key: String,
    shutdown: CancellationToken,
    http: reqwest::Client,
}

async fn start(
    runtime: Arc<FakeRuntime>,
    tweak: impl FnOnce(&mut gateway::config::Config),
) -> Harness {
    let db = common::fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let mut config = common::test_config(Some(db.clone()), data.path());
    // The fake never reads the binary; any existing file will do.
    config.sandbox_init = Some(std::env::current_exe().unwrap());
    tweak(&mut config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(gateway::serve_on(
        listener,
        config,
        runtime,
        shutdown.clone(),
    ));
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if http.get(format!("{url}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    let key = AuditStore::new(pool)
        .create_key("agent", "acme")
        .await
        .unwrap()
        .secret;
    Harness {
        url,
        db,
        key,
        shutdown,
        http,
    }
}

impl Harness {
    async fn execute(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let response = self
            .http
            .post(format!("{}/v1/executions", self.url))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_are_clamped_to_ceilings_and_the_floor_is_applied() {
    let runtime = Arc::new(FakeRuntime::default());
    let h = start(runtime.clone(), |config| {
        config.ceilings.timeout_ms = 1500;
        config.ceilings.memory_mb = 100;
    })
    .await;
    let (status, body) = h
        .execute(json!({"language": "python", "code": "print(1)", "files": [
            {"path": "data/in.csv", "content_b64": "YSxiCjEsMgo="}
        ]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["limits"]["timeout_ms"], 1500, "{body}");
    assert_eq!(body["limits"]["memory_mb"], 100, "{body}");
    let specs = runtime.specs.lock().unwrap();
    let (plan, job) = &specs[0];
    let job = job.as_ref().expect("the job was handed over");
    assert_eq!(plan.runtime, "runsc");
    assert_eq!(plan.image, "sandgate/python");
    assert_eq!(plan.limits.memory_mb, 100);
    assert!(plan.limits.pids >= gateway::app::floor::MIN_PIDS);
    assert_eq!(job.argv, ["python3", "/workspace/main.py"]);
    let paths: Vec<&str> = job.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["/workspace/main.py", "/workspace/data/in.csv"]);
    let env: Vec<&String> = job.env.as_ref().unwrap().keys().collect();
    assert!(
        env.iter()
            .all(|k| !k.contains("SANDGATE") && !k.contains("DATABASE")),
        "{env:?}"
    );
    h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_failure_is_status_error_without_daemon_text() {
    let runtime = Arc::new(FakeRuntime {
        fail: true,
        ..FakeRuntime::default()
    });
    let h = start(runtime.clone(), |_| {}).await;
    let (status, body) = h.execute(json!({"language": "bash", "code": "true"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "error", "{body}");
    assert!(!body.to_string().contains("secret daemon detail"), "{body}");
    h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_file_names_are_refused_before_any_decision() {
    let runtime = Arc::new(FakeRuntime::default());
    let h = start(runtime.clone(), |_| {}).await;
    for path in ["../etc/passwd", "/etc/passwd", "a/../../b", "x\u{0}y", ""] {
        let (status, body) = h
            .execute(json!({"language": "python", "code": "1", "files": [
                {"path": path, "content_b64": ""}
            ]}))
            .await;
        assert_eq!(status, 400, "{path:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("file"),
            "{body}"
        );
    }
    assert_eq!(runtime.runs.load(Ordering::SeqCst), 0);
    h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn reaper_removes_orphans_and_closes_their_records_at_start() {
    let db = common::fresh_database().await;
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    gateway::database::migrate(&pool).await.unwrap();
    let store = AuditStore::new(pool.clone());
    store
        .record_policy_revision("sha256:old", &[], "test")
        .await
        .unwrap();
    let instance = "gw_fixedfortest";
    let now = gateway::ids::now_micros();
    let row = gateway::audit::ExecutionRow {
        id: "ex_orphan".into(),
        tenant: "acme".into(),
        key_id: "key_1".into(),
        language: "python".into(),
        code_sha256: "00".into(),
        code_bytes: 1,
        labels: sqlx::types::Json(json!({})),
        status: gateway::status::ExecutionStatus::Running,
        decision_id: "dc_orphan".into(),
        allow: true,
        reasons: sqlx::types::Json(vec![]),
        backend: Some("gvisor".into()),
        runtime: Some("runsc".into()),
        image: None,
        limits: None,
        policy_revision: "sha256:old".into(),
        created_at: now,
        started_at: Some(now),
        finished_at: None,
        exit_code: None,
        duration_ms: None,
        stdout: None,
        stderr: None,
        stdout_truncated: false,
        stderr_truncated: false,
        outputs: sqlx::types::Json(json!([])),
        error: None,
        instance: Some(instance.into()),
        outputs_skipped: sqlx::types::Json(json!([])),
        outputs_truncated: false,
        purged_at: None,
        start: None,
        container: None,
        session_id: None,
        result: None,
        results: None,
    };
    let event = gateway::audit::NewEvent {
        kind: api_types::EventKind::ExecutionDecision,
        execution_id: Some("ex_orphan".into()),
        key_id: None,
        tenant: Some("acme".into()),
        decision_id: None,
        allow: Some(true),
        reasons: json!([]),
        input: json!({}),
        decision: json!({}),
        policy_revision: None,
    };
    store.record_execution_decision(&row, &event).await.unwrap();

    let runtime = Arc::new(FakeRuntime::default());
    runtime.containers.lock().unwrap().extend([
        SandboxInfo {
            container_id: "c-orphan".into(),
            name: "sandgate-ex_orphan".into(),
            owner: Owner::Execution("ex_orphan".into()),
            instance: Some(instance.into()),
        },
        SandboxInfo {
            container_id: "c-pooled-before-a-restart".into(),
            name: "sandgate-sb_old".into(),
            owner: Owner::Pool {
                language: "python".into(),
            },
            instance: Some(instance.into()),
        },
        SandboxInfo {
            container_id: "c-someone-else".into(),
            name: "sandgate-ex_other".into(),
            owner: Owner::Execution("ex_other".into()),
            instance: Some("gw_another_gateway".into()),
        },
    ]);
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("instance"), format!("{instance}\n")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = common::test_config(Some(db.clone()), data.path());
    config.sandbox_init = Some(std::env::current_exe().unwrap());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(gateway::serve_on(
        listener,
        config,
        runtime.clone(),
        shutdown.clone(),
    ));

    let mut status = String::new();
    for _ in 0..200 {
        status = sqlx::query_scalar("SELECT status FROM executions WHERE id = 'ex_orphan'")
            .fetch_one(&pool)
            .await
            .unwrap();
        if status == "error" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(status, "error");
    let reaped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'execution.reaped' AND execution_id = 'ex_orphan'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(reaped, 1, "the reaper's closure is audited");
    let remaining: Vec<String> = runtime
        .containers
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.container_id.clone())
        .collect();
    assert_eq!(
        remaining,
        ["c-someone-else"],
        "only this instance's orphan is reaped"
    );
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_answers_429_and_the_refusal_is_recorded() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runtime = Arc::new(FakeRuntime {
        gate: Some(gate.clone()),
        ..FakeRuntime::default()
    });
    let h = start(runtime.clone(), |config| {
        config.max_concurrent = 1;
        config.max_queued = 1;
        config.refusals.window_s = 1;
    })
    .await;
    let body = json!({"language": "python", "code": "print(1)", "wait": false});
    let (first, _) = h.execute(body.clone()).await;
    let (second, queued) = h.execute(body.clone()).await;
    let (third, refused) = h.execute(body.clone()).await;
    assert_eq!((first, second), (202, 202));
    assert_eq!(queued["status"], "queued");
    assert_eq!(third, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "rate_limited");
    // The policy allowed it and the gateway refused it: that leaves a trace (issue 15, item 8).
    let pool = sqlx::PgPool::connect(&h.db).await.unwrap();
    let (status, allow, reasons): (String, bool, serde_json::Value) = sqlx::query_as(
        "SELECT status, allow, reasons FROM executions ORDER BY created_at DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), allow), ("denied", false));
    assert_eq!(
        reasons.as_array().unwrap().last().unwrap()["code"],
        "queue.full"
    );
    let (event_allow, said): (bool, serde_json::Value) = sqlx::query_as(
        "SELECT allow, decision FROM audit_events WHERE kind = 'execution.decision' \
         ORDER BY seq DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!event_allow, "the event says what the gateway did");
    assert_eq!(said["allow"], true, "and keeps what the policy said");
    // More refusals in the same window are bounded like any refusal anyone can cause in bulk
    // (item 9): counted into one `queue.refused.repeated` event, not a row each.
    for _ in 0..5 {
        let (status, _) = h.execute(body.clone()).await;
        assert_eq!(status, 429);
    }
    let denied: i64 = sqlx::query_scalar("SELECT count(*) FROM executions WHERE status = 'denied'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(denied <= 2, "{denied} rows for 6 refusals");
    let mut counted = None;
    for _ in 0..100 {
        counted = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT sum((decision->>'repeats')::bigint + (decision->>'throttled')::bigint)::bigint              FROM audit_events WHERE kind = 'queue.refused.repeated'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if counted.unwrap_or(0) + denied == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        counted.unwrap_or(0) + denied,
        6,
        "every refusal is a row or counted in a summary"
    );
    // Let both finish; the queued one runs once the first is done.
    gate.add_permits(2);
    for _ in 0..100 {
        if runtime.runs.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runtime.runs.load(Ordering::SeqCst), 2);
    h.shutdown.cancel();
}

/// One tenant filling its share of the queue leaves room for another (issue 15, item 8): the
/// queue limit is no longer one pool that a single tenant can exhaust.
#[tokio::test(flavor = "multi_thread")]
async fn one_tenant_cannot_take_another_tenants_place_in_the_queue() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runtime = Arc::new(FakeRuntime {
        gate: Some(gate.clone()),
        ..FakeRuntime::default()
    });
    let policies = common::egress::bundle_with_test_tenant(&[]);
    let dir = policies.path().to_owned();
    let h = start(runtime.clone(), move |config| {
        config.policy_dir = dir;
        config.max_concurrent = 1;
        config.max_queued = 4;
        config.max_queued_per_tenant = 2;
    })
    .await;
    let pool = sqlx::PgPool::connect(&h.db).await.unwrap();
    let other = AuditStore::new(pool.clone())
        .create_key("agent", "nettest")
        .await
        .unwrap()
        .secret;
    let body = json!({"language": "python", "code": "print(1)", "wait": false});
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(h.execute(body.clone()).await.0);
    }
    // One runs, two wait (acme's share), the fourth is refused although the queue has room.
    assert_eq!(answers, [202, 202, 202, 429]);
    let response = h
        .http
        .post(format!("{}/v1/executions", h.url))
        .bearer_auth(&other)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        202,
        "the other tenant still queues"
    );
    gate.add_permits(4);
    for _ in 0..200 {
        if runtime.runs.load(Ordering::SeqCst) == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runtime.runs.load(Ordering::SeqCst), 4);
    h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn control_characters_in_free_text_fields_are_400_not_503() {
    let runtime = Arc::new(FakeRuntime::default());
    let h = start(runtime.clone(), |_| {}).await;
    for extra in [
        json!({"labels": {"agent": "a\u{0}b"}}),
        json!({"labels": {"a\nb": "x"}}),
        json!({"network": [{"host": "pypi.org\u{0}", "port": 443}]}),
        json!({"mounts": ["dataset:\u{7}"]}),
    ] {
        let mut body = json!({"language": "python", "code": "print(1)"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, answer) = h.execute(body).await;
        assert_eq!(status, 400, "{extra}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
    }
    assert_eq!(runtime.runs.load(Ordering::SeqCst), 0);
    h.shutdown.cancel();
}

impl FakeRuntime {
    /// Waits until the pool has started `count` sandboxes of this memory size.
    async fn pooled(&self, count: usize, memory_mb: u64) {
        for _ in 0..400 {
            let started = self
                .specs
                .lock()
                .unwrap()
                .iter()
                .filter(|(plan, _)| {
                    matches!(plan.owner, Owner::Pool { .. }) && plan.limits.memory_mb == memory_mb
                })
                .count();
            if started >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the pool never started {count} sandboxes of {memory_mb} MB");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_sandbox_serves_a_decision_of_its_shape_and_others_run_cold() {
    let runtime = Arc::new(FakeRuntime::default());
    let h = start(runtime.clone(), |config| {
        config.warm_pool = [("bash".to_owned(), 1)].into();
    })
    .await;
    runtime.pooled(1, 512).await;
    // acme's decision: 512 MB, 1 CPU, 256 pids, 256 MB disk: the seeded shape.
    let (status, warm) = h
        .execute(json!({"language": "bash", "code": "true", "limits": {"timeout_ms": 2000}}))
        .await;
    assert_eq!(status, 200, "{warm}");
    assert_eq!(warm["start"], "warm", "{warm}");
    let container = warm["container"].as_str().unwrap();
    assert!(container.starts_with("sandgate-sb_"), "{warm}");
    {
        let specs = runtime.specs.lock().unwrap();
        let (plan, job) = specs
            .iter()
            .find(|(plan, _)| plan.container_name() == container)
            .unwrap();
        assert_eq!(
            plan.owner,
            Owner::Pool {
                language: "bash".into()
            }
        );
        assert_eq!(
            plan.waits,
            gateway::runtime::Waits::Pool(gateway::runtime::PoolRunner::Plain)
        );
        let job = job.as_ref().expect("the claim handed the job over");
        assert_eq!(job.argv, ["bash", "/workspace/main.sh"]);
    }
    // Another shape runs cold, and the pool is re-shaped to it.
    let (status, cold) = h
        .execute(json!({"language": "bash", "code": "true", "limits": {"memory_mb": 256}}))
        .await;
    assert_eq!(status, 200, "{cold}");
    assert_eq!(cold["start"], "cold", "{cold}");
    assert_eq!(
        cold["container"],
        format!("sandgate-{}", cold["id"].as_str().unwrap())
    );
    runtime.pooled(1, 256).await;
    let (_, again) = h
        .execute(json!({"language": "bash", "code": "true", "limits": {"memory_mb": 256}}))
        .await;
    assert_eq!(again["start"], "warm", "{again}");
    h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_sandbox_that_died_waiting_is_never_handed_out() {
    let runtime = Arc::new(FakeRuntime {
        pooled_die: true,
        ..FakeRuntime::default()
    });
    let h = start(runtime.clone(), |config| {
        config.warm_pool = [("bash".to_owned(), 1)].into();
    })
    .await;
    // Each pooled sandbox ends 50 ms after it is ready; the pool replaces it.
    runtime.pooled(3, 512).await;
    for _ in 0..5 {
        let (status, body) = h.execute(json!({"language": "bash", "code": "true"})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "succeeded", "{body}");
        tokio::time::sleep(Duration::from_millis(60)).await;
        if body["start"] == "warm" {
            // Claimed within its 50 ms of life: it must have run the job, not died first.
            let specs = runtime.specs.lock().unwrap();
            let (_, job) = specs
                .iter()
                .find(|(plan, _)| plan.container_name() == body["container"].as_str().unwrap())
                .unwrap();
            assert!(job.is_some(), "{body}");
        }
    }
    h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_pool_is_not_ready_and_executions_run_cold() {
    let runtime = Arc::new(FakeRuntime {
        fail: true,
        ..FakeRuntime::default()
    });
    let h = start(runtime.clone(), |config| {
        config.warm_pool = [("bash".to_owned(), 1)].into();
    })
    .await;
    let mut ready = serde_json::Value::Null;
    for _ in 0..200 {
        ready = h
            .http
            .get(format!("{}/readyz", h.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if ready["checks"]["warm_pool"]["ok"] == json!(false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(ready["checks"]["warm_pool"]["ok"], json!(false), "{ready}");
    assert!(
        ready["missing"].to_string().contains("warm_pool"),
        "{ready}"
    );
    h.shutdown.cancel();
}
