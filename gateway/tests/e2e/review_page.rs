//! The review page (`/ui/`) in headless Chromium, driven over the DevTools protocol, through the
//! real gateway: a reviewer pastes a key, approves a held request by clicking, and sees the
//! execution finish in gVisor, and approves a held session; an auditor sees no review buttons, opens an execution's detail
//! view under its row, downloads an output, filters, pages, and opens a session's executions.
//! Screenshots land in `<target>/review-page*.png`. Chromium missing is a failure, not a skip.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::browser;
use crate::common;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use browser::{js, Browser};
use common::TestGateway;
use gateway::audit::AuditStore;

#[tokio::test]
async fn a_reviewer_approves_on_the_page_and_sees_the_run_finish() {
    let browser = Browser::start().await;
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "assistant-7").await;
    let reviewer = gw.key_of("reviewer", "acme", "carol").await;

    // The page is static, self-contained and under a strict CSP.
    let page = gw.http.get(format!("{}/ui/", gw.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(!html.contains("<script>"), "no inline script");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no CDN"
    );

    // Code that would be markup if the page used innerHTML.
    let code = "print('<img id=injected src=x>approved on the page')";
    let (status, held) = gw
        .execute(
            &agent,
            "python",
            code,
            json!({"network": [{"host": "review.example", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["id"].as_str().unwrap().to_owned();
    let approval = held["approval_id"].as_str().unwrap().to_owned();

    let mut cdp = browser.page().await;
    cdp.open(&format!("{}/ui/", gw.url)).await;
    // Before a key is entered the page claims nothing about what is pending.
    let note = cdp.text("#approvals-note").await;
    assert!(
        !note.contains("No pending") && note.contains("Paste a key"),
        "{note}"
    );

    // Paste the key once, then click Approve on the held request.
    cdp.use_key(&reviewer).await;
    let row = format!("tr[data-approval-id={}]", js(&approval));
    cdp.wait_for(
        &format!(
            "!!document.querySelector({})",
            js(&format!("{row} button.approve"))
        ),
        "the pending approval",
        30,
    )
    .await;
    let shown = cdp
        .eval(&format!("document.querySelector({}).innerText", js(&row)))
        .await;
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("<img id=injected"),
        "code shown as text: {shown}"
    );
    assert!(shown.contains("review.example"), "{shown}");
    assert_eq!(
        cdp.eval("document.getElementById('injected') === null")
            .await,
        json!(true),
        "data must never become markup"
    );
    cdp.eval(&format!(
        "document.querySelector({}).value = 'looks fine'; \
         document.querySelector({}).click(); true",
        js(&format!("{row} input.comment")),
        js(&format!("{row} button.approve"))
    ))
    .await;

    // The execution runs and the page shows it finish; a reviewer may not verify the chain.
    let status_cell = js(&format!(
        "#executions tr[data-execution-id=\"{id}\"] .status"
    ));
    cdp.wait_for(
        &format!("(document.querySelector({status_cell}) || {{}}).textContent === 'succeeded'"),
        "the execution to succeed on the page",
        120,
    )
    .await;
    cdp.wait_for(
        "document.getElementById('chain').textContent.includes('not permitted')",
        "the chain status",
        10,
    )
    .await;
    cdp.wait_for(
        &format!("!document.querySelector({})", js(&row)),
        "the approval to leave the pending list",
        10,
    )
    .await;

    // A second request waiting, so the screenshot shows the review controls too.
    let (status, waiting) = gw
        .execute(
            &agent,
            "bash",
            "curl -s https://files.example.org/data.csv | wc -l",
            json!({"network": [{"host": "files.example.org", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 202, "{waiting}");
    let waiting_row = format!(
        "tr[data-approval-id={}]",
        js(waiting["approval_id"].as_str().unwrap())
    );
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&waiting_row)),
        "the second pending approval",
        30,
    )
    .await;

    cdp.wait_for(
        "document.getElementById('whoami').textContent.includes('carol (reviewer')",
        "the page to say who the key is",
        10,
    )
    .await;
    cdp.screenshot("review-page.png").await;

    // The API agrees with the page.
    let (_, done) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["stdout"],
        "<img id=injected src=x>approved on the page\n"
    );
    let (_, decided) = gw
        .get(&reviewer, &format!("/v1/approvals/{approval}"))
        .await;
    assert_eq!(decided["status"], "approved", "{decided}");
    assert_eq!(decided["reviewer"]["principal"], "carol");
    assert_eq!(decided["comment"], "looks fine");
    drop(cdp);
    drop(browser);
    gw.stop().await;
}

/// A session held for review shows what was asked where an execution's code would be (it has
/// no code yet), and approving it on the page opens it.
#[tokio::test]
async fn a_reviewer_approves_a_held_session_on_the_page() {
    let browser = Browser::start().await;
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "assistant-7").await;
    let reviewer = gw.key_of("reviewer", "acme", "carol").await;
    let body = json!({
        "language": "python",
        "network": [{"host": "review.example", "port": 443}],
        "idle_timeout_s": 120,
    });
    let (status, held) = gw.post(&agent, "/v1/sessions", &body).await;
    assert_eq!(status, 202, "{held}");
    let id = held["id"].as_str().unwrap().to_owned();
    let row = format!(
        "tr[data-approval-id={}]",
        js(held["approval_id"].as_str().unwrap())
    );

    let mut cdp = browser.page().await;
    cdp.open(&format!("{}/ui/", gw.url)).await;
    cdp.use_key(&reviewer).await;
    cdp.wait_for(
        &format!(
            "!!document.querySelector({})",
            js(&format!("{row} button.approve"))
        ),
        "the pending session approval",
        30,
    )
    .await;
    let shown = cdp
        .eval(&format!("document.querySelector({}).innerText", js(&row)))
        .await;
    let shown = shown.as_str().unwrap();
    for asked in [
        id.as_str(),
        "session (python)",
        "review.example:443",
        "idle timeout: 120 s",
    ] {
        assert!(shown.contains(asked), "{asked} not shown: {shown}");
    }
    cdp.eval(&format!(
        "document.querySelector({}).click(); true",
        js(&format!("{row} button.approve"))
    ))
    .await;
    cdp.wait_for(
        &format!("!document.querySelector({})", js(&row)),
        "the approval to leave the pending list",
        60,
    )
    .await;
    // The approval leaves the pending list once decided; the session's sandbox starts after,
    // in the approval's own task.
    common::eventually(
        Duration::from_secs(60),
        "the approved session to be ready",
        || async {
            let (_, opened) = gw.get(&agent, &format!("/v1/sessions/{id}")).await;
            assert_ne!(opened["status"], "closed", "{opened}");
            opened["status"] == "ready"
        },
    )
    .await;
    drop(cdp);
    drop(browser);
    gw.stop().await;
}

/// Runs the execution the auditor looks at: labels, an uploaded file, a denied egress attempt
/// through the proxy (no DNS for a denied name), an output file. Returns its record.
async fn labelled_run(gw: &TestGateway, agent: &str) -> Value {
    let code = "import urllib.request\n\
        rows = len(open('data.csv').read().splitlines())\n\
        open('/output/report.txt', 'w').write('rows: %d\\n' % rows)\n\
        try:\n    urllib.request.urlopen('https://evil.example/', timeout=20)\n\
        except Exception as err:\n    print('refused:', type(err).__name__)\n\
        print('done')\n";
    let csv = base64::engine::general_purpose::STANDARD.encode("a,b\n1,2\n3,4\n");
    let (status, record) = gw
        .execute(
            agent,
            "python",
            code,
            json!({
                "labels": {"agent": "analyst-7", "ticket": "T-1"},
                "files": [{"path": "data.csv", "content_b64": csv}],
                "network": [{"host": "pypi.org", "port": 443}],
            }),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    record
}

/// One request inside an inspected tunnel, recorded for `execution` on its first connection as
/// the proxy records it (inspection needs a credential upstream; `egress_inspect.rs` drives
/// that path for real), so the detail view has a row to show.
async fn recorded_request(gw: &TestGateway, execution: &str, connection: &str) {
    let pool = gw.pool().await;
    let store = AuditStore::new(pool.clone());
    let request = gateway::audit::egress::RequestOpen {
        connection_id: connection.into(),
        owner: gateway::audit::egress::EgressOwner {
            execution_id: Some(execution.into()),
            session_id: None,
        },
        tenant: "acme".into(),
        host: "api.example.com".into(),
        port: 443,
        method: "DELETE".into(),
        path: "/repos/acme/app".into(),
        query_sha256: None,
        header_names: vec!["host".into()],
        credentials: vec![],
        upgrade: None,
        allow: false,
        reason: "egress.method_not_allowed".into(),
        message: String::new(),
        policy_reasons: json!([]),
        policy_revision: "sha256:test".into(),
        started_at: gateway::ids::now_micros(),
    };
    store.open_request(&request).await.unwrap();
    pool.close().await;
}

/// Rows of the executions table, by execution id, in order.
async fn listed(cdp: &mut browser::Cdp) -> Vec<String> {
    let ids = cdp
        .eval(
            "Array.from(document.querySelectorAll('#executions > tbody > tr[data-execution-id]'))\
             .map((r) => r.dataset.executionId)",
        )
        .await;
    serde_json::from_value(ids).unwrap()
}

#[tokio::test]
async fn an_auditor_reads_details_filters_pages_and_sessions_without_review_buttons() {
    let browser = Browser::start().await;
    let gw = TestGateway::start().await;
    let agent = gw.key_of("agent", "acme", "assistant-7").await;
    let auditor = gw.key_of("auditor", "acme", "dana").await;

    let record = labelled_run(&gw, &agent).await;
    let id = record["id"].as_str().unwrap().to_owned();
    let (_, conns) = gw
        .get(&agent, &format!("/v1/executions/{id}/connections"))
        .await;
    let evil = &conns["connections"][0];
    assert_eq!(evil["host"], "evil.example", "{conns}");
    assert_eq!(evil["allow"], false, "{conns}");
    recorded_request(&gw, &id, evil["id"].as_str().unwrap()).await;
    // One held for review, one other label, a session of two executions, and refusals to page.
    let (status, held) = gw
        .execute(
            &agent,
            "python",
            "print('held')",
            json!({"network": [{"host": "review.example", "port": 443}],
                   "labels": {"agent": "analyst-8"}}),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();
    for code in ["x = 41", "x + 1"] {
        let (status, ran) = gw
            .post(
                &agent,
                &format!("/v1/sessions/{session}/executions"),
                &json!({"code": code}),
            )
            .await;
        assert_eq!(status, 200, "{ran}");
    }
    for _ in 0..11 {
        let (status, denied) = gw
            .execute(
                &agent,
                "python",
                "print(1)",
                json!({"mounts": ["dataset:nope"], "labels": {"batch": "refused"}}),
            )
            .await;
        assert_eq!(status, 403, "{denied}");
    }

    let mut cdp = browser.page().await;
    let download_dir = tempfile::tempdir().unwrap();
    let downloads = browser.allow_downloads(download_dir.path()).await;
    cdp.record_csp_violations().await;
    cdp.open(&format!("{}/ui/", gw.url)).await;
    let note = cdp.text("#approvals-note").await;
    assert!(!note.contains("No pending"), "before a key: {note}");
    cdp.use_key(&auditor).await;

    // The held request is shown, but an auditor gets no way to decide it.
    let held_row = format!(
        "tr[data-approval-id={}]",
        js(held["approval_id"].as_str().unwrap())
    );
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&held_row)),
        "the pending approval",
        30,
    )
    .await;
    assert_eq!(
        cdp.eval(
            "document.querySelectorAll('button.approve, button.reject, input.comment').length"
        )
        .await,
        json!(0),
        "no review controls for an auditor"
    );
    assert!(
        cdp.text("#approvals-note").await.contains("View only"),
        "{}",
        cdp.text("#approvals-note").await
    );
    assert!(cdp.text(&held_row).await.contains("agent=analyst-8"));

    // Labels and human timestamps in the list.
    let row = format!("#executions tr[data-execution-id={}]", js(&id));
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&row)),
        "the execution row",
        30,
    )
    .await;
    let shown = cdp.text(&row).await;
    assert!(
        shown.contains("agent=analyst-7") && shown.contains("ticket=T-1"),
        "{shown}"
    );
    let created = record["created_at"].as_str().unwrap();
    assert!(
        !shown.contains(created) && !shown.contains(&created[..19]),
        "{shown}"
    );
    assert!(shown.contains(" ago)"), "relative time shown: {shown}");

    // The detail view opens directly under its row, with everything about the execution.
    cdp.click(&format!("{row} button.details")).await;
    let detail = format!("tr.detail-row[data-detail-for={}]", js(&format!("x:{id}")));
    cdp.wait_for(
        &format!(
            "!!document.querySelector({}) && document.querySelector({}).innerText.includes('Audit events')",
            js(&detail),
            js(&detail)
        ),
        "the detail view",
        30,
    )
    .await;
    let adjacent = cdp
        .eval(&format!(
            "(() => {{ const r = document.querySelector({}); const d = r.nextElementSibling; \
             return d.matches({}) && Math.abs(d.getBoundingClientRect().top - \
             r.getBoundingClientRect().bottom) < 2; }})()",
            js(&row),
            js(&detail)
        ))
        .await;
    assert_eq!(
        adjacent,
        json!(true),
        "the detail must sit right under its row"
    );
    let text = cdp.text(&detail).await;
    for expected in [
        "Decision",
        "allow",
        "gvisor",
        "Limits",
        "memory",
        "Grant",
        "pypi.org",
        "data.csv",
        "12 B",
        "report.txt",
        "evil.example",
        "egress.host_not_granted",
        "DELETE",
        "egress.method_not_allowed",
        "execution.decision",
        "refused: ",
    ] {
        assert!(
            text.contains(expected),
            "detail lacks {expected:?}:\n{text}"
        );
    }
    cdp.screenshot("review-page-detail.png").await;

    // The output downloads through the API with the key.
    cdp.click(&format!("{detail} a.download")).await;
    let saved = download_dir.path().join("report.txt");
    for _ in 0..100 {
        if saved.is_file() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), "rows: 3\n");

    // Filters: by label, by status, by tenant.
    let filter = |label: &str, status: &str, tenant: &str| {
        format!(
            "document.getElementById('filter-label').value = {}; \
             document.getElementById('filter-status').value = {}; \
             document.getElementById('filter-tenant').value = {}; \
             document.getElementById('apply-filters').click(); true",
            js(label),
            js(status),
            js(tenant)
        )
    };
    cdp.eval(&filter("agent=analyst-7", "", "")).await;
    cdp.wait_for(
        "document.querySelectorAll('#executions > tbody > tr[data-execution-id]').length === 1",
        "the label filter",
        10,
    )
    .await;
    assert_eq!(listed(&mut cdp).await, vec![id.clone()]);
    cdp.eval(&filter("", "pending_approval", "acme")).await;
    cdp.wait_for(
        &format!(
            "document.querySelectorAll('#executions > tbody > tr[data-execution-id]').length === 1 \
             && !!document.querySelector('#executions tr[data-execution-id={}]')",
            held["id"].as_str().unwrap()
        ),
        "the status filter",
        10,
    )
    .await;
    cdp.eval(&filter("", "", "globex")).await;
    cdp.wait_for(
        "document.querySelectorAll('#executions > tbody > tr[data-execution-id]').length === 0",
        "the tenant filter",
        10,
    )
    .await;

    // Paging, 10 a page: 15 executions are 10 then 5, and back.
    cdp.eval(
        "document.getElementById('filters').reset(); \
         document.getElementById('filter-limit').value = '10'; \
         document.getElementById('apply-filters').click(); true",
    )
    .await;
    cdp.wait_for(
        "document.getElementById('page-info').textContent === 'page 1 (10 executions)'",
        "the first page",
        10,
    )
    .await;
    let first = listed(&mut cdp).await;
    cdp.click("#older").await;
    cdp.wait_for(
        "document.getElementById('page-info').textContent === 'page 2 (5 executions)'",
        "the second page",
        10,
    )
    .await;
    let second = listed(&mut cdp).await;
    assert!(
        second.iter().all(|x| !first.contains(x)),
        "{first:?} {second:?}"
    );
    assert!(second.contains(&id), "the oldest is on the last page");
    cdp.click("#newer").await;
    cdp.wait_for(
        "document.getElementById('page-info').textContent === 'page 1 (10 executions)'",
        "back to the first page",
        10,
    )
    .await;

    // The session and, under it, its executions.
    let session_row = format!("#sessions tr[data-session-id={}]", js(&session));
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&session_row)),
        "the session row",
        10,
    )
    .await;
    let shown = cdp.text(&session_row).await;
    assert!(
        shown.contains("ready") && shown.contains("python"),
        "{shown}"
    );
    cdp.click(&format!("{session_row} button.session-executions"))
        .await;
    let nested = format!(
        "tr.detail-row[data-detail-for={}] table.session-executions tbody > tr[data-execution-id]",
        js(&format!("s:{session}"))
    );
    cdp.wait_for(
        &format!("document.querySelectorAll({}).length === 2", js(&nested)),
        "the session's executions",
        10,
    )
    .await;
    // The second (`x + 1`) has a result.
    cdp.eval(&format!(
        "document.querySelectorAll({})[1].querySelector('button.details').click(); true",
        js(&nested)
    ))
    .await;
    cdp.wait_for(
        "Array.from(document.querySelectorAll('.detail')).some((d) => /result\\s+42/.test(d.innerText))",
        "a session execution's detail",
        10,
    )
    .await;
    cdp.screenshot("review-page-auditor.png").await;
    assert_eq!(cdp.csp_violations().await, json!([]), "no CSP violations");
    drop(downloads);
    drop(cdp);
    drop(browser);
    gw.stop().await;
}
