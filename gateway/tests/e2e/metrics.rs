//! `GET /metrics` through a real gateway: who may scrape it, the series of DESIGN 12, a real
//! parser's verdict on the text (`promtool check metrics`, Debian's `prometheus` package), and
//! values that move when executions run, are denied, and try the network.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::json;

use common::egress::{bundle_with_test_tenant, gateway_with};
use common::TestGateway;

const SERIES: [&str; 10] = [
    "sandgate_executions_total",
    "sandgate_decisions_total",
    "sandgate_egress_total",
    "sandgate_execution_seconds",
    "sandgate_warm_pool_ready",
    "sandgate_audit_append_seconds",
    "sandgate_sessions_open",
    "sandgate_warm_claims_total",
    "sandgate_warm_waiting",
    "sandgate_warm_waiting_memory_bytes",
];

async fn scrape(gw: &TestGateway, key: Option<&str>) -> (u16, String, String) {
    let mut request = gw.http.get(format!("{}/metrics", gw.url));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, content_type, response.text().await.unwrap())
}

/// Sample name with labels -> value, e.g. `sandgate_executions_total{status="denied"}`.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// `promtool check metrics` on `text`: its lint findings, or a panic saying how to install it.
fn promtool_check(text: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| {
            panic!("promtool not runnable ({err}): `apt-get install prometheus` (scripts/setup.sh does it)")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool rejected /metrics: {said}\n{text}"
    );
    said
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_need_an_auditor_or_admin_key() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let auditor = gw.key("auditor", "audit").await;
    let admin = gw.key("admin", "ops").await;
    assert_eq!(scrape(&gw, None).await.0, 401);
    assert_eq!(scrape(&gw, Some("sg_not_a_key")).await.0, 401);
    assert_eq!(scrape(&gw, Some(&agent)).await.0, 403);
    let (status, content_type, text) = scrape(&gw, Some(&auditor)).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    assert_eq!(scrape(&gw, Some(&admin)).await.0, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_and_move_when_executions_run_are_denied_and_dial_out() {
    let policies = bundle_with_test_tenant(&[("loop.test", 9)]);
    let gw = gateway_with(policies.path(), &[("loop.test", "127.0.0.1")]).await;
    let agent = gw.key("agent", "nettest").await;
    let auditor = gw.key("auditor", "audit").await;

    let (_, _, before) = scrape(&gw, Some(&auditor)).await;
    let findings = promtool_check(&before);
    assert!(
        findings.trim().is_empty(),
        "promtool lint findings: {findings}"
    );
    for name in SERIES {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{before}"
        );
    }
    let before = samples(&before);
    assert!(before.contains_key("sandgate_warm_pool_ready{language=\"python\"}"));
    assert_eq!(before["sandgate_sessions_open"], 0.0);

    // One that runs and dials a name the proxy refuses (it resolves to loopback).
    let code = "import urllib.request\ntry:\n    urllib.request.urlopen('http://loop.test:9/', timeout=10)\nexcept Exception as e:\n    print(type(e).__name__)\n";
    let network = json!({"network": [{"host": "loop.test", "port": 9}]});
    let (status, body) = gw.execute(&agent, "python", code, network).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    // One that fails, one the policy denies.
    let (_, body) = gw.execute(&agent, "bash", "exit 3", json!({})).await;
    assert_eq!(body["status"], "failed", "{body}");
    let (status, body) = gw.execute(&agent, "cobol", "x", json!({})).await;
    assert_eq!(status, 403, "{body}");

    let (_, _, after) = scrape(&gw, Some(&auditor)).await;
    promtool_check(&after);
    let after = samples(&after);
    let moved = |series: &str| after[series] - before[series];
    assert_eq!(
        moved("sandgate_executions_total{status=\"succeeded\"}"),
        1.0
    );
    assert_eq!(moved("sandgate_executions_total{status=\"failed\"}"), 1.0);
    assert_eq!(moved("sandgate_executions_total{status=\"denied\"}"), 1.0);
    assert_eq!(moved("sandgate_decisions_total{outcome=\"allow\"}"), 2.0);
    assert_eq!(moved("sandgate_decisions_total{outcome=\"deny\"}"), 1.0);
    assert_eq!(moved("sandgate_egress_total{decision=\"deny\"}"), 1.0);
    assert_eq!(moved("sandgate_execution_seconds_count"), 2.0);
    assert!(moved("sandgate_execution_seconds_sum") > 0.0);
    // Three decisions and one egress attempt, at least (key creation and failed logins add more).
    assert!(moved("sandgate_audit_append_seconds_count") >= 4.0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_warm_pool_gauge_follows_the_pool() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), |config| {
        config.warm_pool = [("bash".to_owned(), 1)].into_iter().collect();
    })
    .await;
    let auditor = gw.key("auditor", "audit").await;
    let series = "sandgate_warm_pool_ready{language=\"bash\"}";
    let mut seen = Vec::new();
    for _ in 0..240 {
        let (_, _, text) = scrape(&gw, Some(&auditor)).await;
        let ready = samples(&text).get(series).copied();
        if ready == Some(1.0) {
            gw.stop().await;
            return;
        }
        seen.push(ready);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    panic!("{series} never reached 1 (the pool's waiting bash sandbox): {seen:?}");
}

/// `dashboards/prometheus/metrics.json`: every query is PromQL that `promtool check rules`
/// accepts, and reads only series `/metrics` serves.
#[test]
fn the_metrics_dashboard_queries_parse_and_name_served_series() {
    let path = common::workspace_root().join("dashboards/prometheus/metrics.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let served = gateway::metrics::Metrics::new(["python"]).render();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut count = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        assert_eq!(
            panel["datasource"]["type"], "prometheus",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("sandgate_"))
            {
                assert!(
                    served.lines().any(|line| line.starts_with(name)),
                    "{}: {name} is not served by /metrics",
                    panel["title"]
                );
            }
            count += 1;
            rules.push_str(&format!(
                "      - record: dashboard:query{count}\n        expr: {}\n",
                serde_json::to_string(expr).unwrap()
            ));
        }
    }
    assert!(count >= 7, "{count} queries");
    let file = tempfile::Builder::new().suffix(".yml").tempfile().unwrap();
    std::fs::write(file.path(), rules).unwrap();
    let output = Command::new("promtool")
        .args(["check", "rules"])
        .arg(file.path())
        .output()
        .unwrap_or_else(|err| {
            panic!("promtool not runnable ({err}): `apt-get install prometheus`")
        });
    assert!(
        output.status.success(),
        "promtool rejected a dashboard query: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
