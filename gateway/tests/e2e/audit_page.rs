//! The auditor page (`/ui/audit.html`) in headless Chromium through the real gateway: charts
//! over the `v_*` views (via `GET /v1/audit/summary`) drawn by the vendored Chart.js, under the
//! same CSP as the review page, with no violation. Screenshot: `<target>/audit-page.png`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::browser;
use crate::common;

use serde_json::{json, Value};

use browser::{js, Browser};
use common::TestGateway;

/// The sum of the chart's data set `index` (all of them when `None`).
fn chart_total(chart: &str, index: Option<usize>) -> String {
    let sets = match index {
        Some(i) => format!("[c.data.datasets[{i}]]"),
        None => "c.data.datasets".to_owned(),
    };
    format!(
        "(() => {{ const c = Chart.getChart(document.getElementById({})); if (!c) return -1; \
         return {sets}.reduce((n, d) => n + d.data.reduce((a, b) => a + b, 0), 0); }})()",
        js(&format!("chart-{chart}"))
    )
}

#[tokio::test]
async fn an_auditor_sees_charts_of_decisions_denials_egress_approvals_executions_and_sessions() {
    let browser = Browser::start().await;
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "assistant-7").await;
    let auditor = gw.key_of("auditor", "acme", "dana").await;
    let reviewer = gw.key_of("reviewer", "acme", "carol").await;

    // Allowed, with two denied egress attempts (no DNS for a denied name).
    let code = "import urllib.request\n\
        for _ in range(2):\n    try:\n        urllib.request.urlopen('https://evil.example/', timeout=20)\n\
        \x20   except Exception as err:\n        print(type(err).__name__)\n";
    let (status, ran) = gw
        .execute(
            &agent,
            "python",
            code,
            json!({"network": [{"host": "pypi.org", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["status"], "succeeded", "{ran}");
    // Denied by the policy, twice; one held for review; one session open.
    for _ in 0..2 {
        let (status, denied) = gw
            .execute(
                &agent,
                "python",
                "print(1)",
                json!({"mounts": ["dataset:nope"]}),
            )
            .await;
        assert_eq!(status, 403, "{denied}");
    }
    let (status, held) = gw
        .execute(
            &agent,
            "python",
            "print('held')",
            json!({"network": [{"host": "review.example", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");

    let mut cdp = browser.page().await;
    cdp.record_csp_violations().await;
    cdp.open(&format!("{}/ui/audit.html", gw.url)).await;

    // A reviewer is told the charts need another role.
    cdp.use_key(&reviewer).await;
    cdp.wait_for(
        "document.getElementById('message').textContent.includes('auditor or admin key')",
        "the role message",
        10,
    )
    .await;

    cdp.use_key(&auditor).await;
    cdp.wait_for(
        "!!document.body.dataset.drawn",
        "the charts to be drawn",
        30,
    )
    .await;
    let total = |chart: &str, index: Option<usize>| chart_total(chart, index);
    // Decisions over time: allow, review, deny (the two refusals; sessions and egress count too).
    assert!(
        cdp.eval(&total("decisions", Some(0)))
            .await
            .as_i64()
            .unwrap()
            >= 1
    );
    assert_eq!(cdp.eval(&total("decisions", Some(1))).await, json!(1));
    assert!(
        cdp.eval(&total("decisions", Some(2)))
            .await
            .as_i64()
            .unwrap()
            >= 2
    );
    let denials: Value = cdp
        .eval("Chart.getChart(document.getElementById('chart-denials')).data.labels")
        .await;
    assert!(
        denials
            .as_array()
            .unwrap()
            .contains(&json!("mount.not_allowed")),
        "{denials}"
    );
    let egress: Value = cdp
        .eval(
            "(() => { const c = Chart.getChart(document.getElementById('chart-egress')); \
             return [c.data.labels, c.data.datasets.map((d) => d.label + ':' + d.data.join(','))]; })()",
        )
        .await;
    assert_eq!(egress, json!([["evil.example"], ["allow:0", "deny:2"]]));
    assert_eq!(
        cdp.eval("Chart.getChart(document.getElementById('chart-approvals')).data.labels.length")
            .await,
        json!(1)
    );
    let statuses: Value = cdp
        .eval("Chart.getChart(document.getElementById('chart-executions')).data.labels")
        .await;
    for status in ["denied", "pending_approval", "succeeded"] {
        assert!(
            statuses.as_array().unwrap().contains(&json!(status)),
            "{statuses}"
        );
    }
    assert!(
        cdp.eval(&total("durations", Some(2)))
            .await
            .as_i64()
            .unwrap()
            > 0
    );
    let sessions: Value = cdp
        .eval("Chart.getChart(document.getElementById('chart-sessions')).data.labels")
        .await;
    let id = session["id"].as_str().unwrap();
    assert!(
        sessions.as_array().unwrap()[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("ss_\u{2026}{} (acme, python", &id[id.len() - 7..])),
        "{sessions}"
    );
    cdp.screenshot("audit-page.png").await;
    assert_eq!(cdp.csp_violations().await, json!([]), "no CSP violations");

    // The page and its library are served from the gateway, under the CSP.
    for file in ["audit.html", "audit.js", "chart.umd.min.js"] {
        let answer = gw
            .http
            .get(format!("{}/ui/{file}", gw.url))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{file}");
        let csp = answer.headers()["content-security-policy"]
            .to_str()
            .unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{file}: {csp}");
    }
    let html = gw
        .http
        .get(format!("{}/ui/audit.html", gw.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !html.contains("<script>") && !html.contains("https://"),
        "no inline script, no CDN"
    );
    drop(cdp);
    drop(browser);
    gw.stop().await;
}
