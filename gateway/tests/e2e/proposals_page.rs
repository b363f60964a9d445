//! The review page's Policy proposals view (issue 25) in headless Chromium, through the real
//! gateway: a reviewer opens a proposal made from a denial, sees its patch, tests and replay
//! impact with the denied execution as an example, approves it with a comment using only
//! focusable controls; the example opens that execution's detail, whose "Propose a change"
//! says the bundle has nothing more to suggest once the change is active.
//! Screenshot: `<target>/proposals-page.png`.

use crate::browser;
use crate::common;

use serde_json::json;

use browser::{js, Browser};
use common::{copy_of_shipped, fresh_database, TestGateway};

#[tokio::test]
async fn a_reviewer_reads_the_evidence_and_approves_on_the_page() {
    let browser = Browser::start().await;
    let policy = copy_of_shipped();
    let tenants = policy.path().join("data/tenants.yaml");
    let mut text = std::fs::read_to_string(&tenants).unwrap();
    text.push_str(
        "\n  lab:\n    languages: [python]\n    backend: gvisor\n    limits:\n      \
         timeout_ms: 5000\n      memory_mb: 256\n      cpus: 0.5\n      pids: 256\n      \
         disk_mb: 32\n      output_bytes: 65536\n",
    );
    std::fs::write(&tenants, text).unwrap();
    let dir = policy.path().to_owned();
    let gw =
        TestGateway::start_with(Some(fresh_database().await), move |c| c.policy_dir = dir).await;
    let agent = gw.key("agent", "lab").await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );

    let (status, denied) = gw.execute(&agent, "bash", "echo hi", json!({})).await;
    assert_eq!(status, 403, "{denied}");
    let execution = denied["error"]["execution_id"].as_str().unwrap().to_owned();
    let body = json!({"from_execution": execution});
    let (status, proposal) = gw.post(&alice, "/v1/policy/proposals", &body).await;
    assert_eq!(status, 201, "{proposal}");

    let mut cdp = browser.page().await;
    cdp.open(&format!("{}/ui/", gw.url)).await;
    cdp.use_key(&bob).await;
    cdp.wait_for(
        "!!document.querySelector('#proposals-list table.proposals button')",
        "the open proposal in the list",
        30,
    )
    .await;
    // Keyboard-usable: the controls are buttons and fields, reachable by Tab.
    let focusable = cdp
        .eval(
            "[...document.querySelectorAll('#proposals-list button')].every(b => b.tabIndex >= 0)",
        )
        .await;
    assert_eq!(focusable, json!(true));
    cdp.click("#proposals-list table.proposals button").await;
    cdp.wait_for(
        "!!document.getElementById('proposal-approve')",
        "the proposal's detail",
        30,
    )
    .await;
    let shown = cdp.text("#proposal").await;
    assert!(shown.contains("\"bash\""), "the patch: {shown}");
    assert!(
        shown.contains("deny -> allow: 1"),
        "the replay impact: {shown}"
    );
    assert!(shown.contains("pass: "), "the tests: {shown}");
    let example = format!(
        "#proposal button[aria-label={}]",
        js(&format!("open execution {execution}"))
    );
    assert_eq!(
        cdp.eval(&format!("!!document.querySelector({})", js(&example)))
            .await,
        json!(true),
        "the denied execution as an example: {shown}"
    );
    cdp.screenshot("proposals-page.png").await;

    cdp.eval(
        "document.getElementById('proposal-comment').value = 'lab shell ok'; \
         document.getElementById('proposal-approve').focus(); \
         document.activeElement.click(); true",
    )
    .await;
    cdp.wait_for(
        "document.getElementById('message').textContent.includes('approved')",
        "the approval on the page",
        60,
    )
    .await;
    let id = proposal["id"].as_str().unwrap();
    let (_, after) = gw.get(&bob, &format!("/v1/policy/proposals/{id}")).await;
    assert_eq!(after["status"], "approved", "{after}");
    assert_eq!(after["comment"], "lab shell ok");

    // The example opens the execution's detail; "Propose a change" asks the bundle again.
    // The approval re-renders the proposal view; a click that lands on the old one opens
    // nothing, so it is tried again while the detail has not appeared.
    let detail = "!!document.querySelector('#proposal-execution button.propose')";
    for _ in 0..6 {
        cdp.click(&example).await;
        for _ in 0..25 {
            if cdp.eval(detail).await == serde_json::json!(true) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        if cdp.eval(detail).await == serde_json::json!(true) {
            break;
        }
    }
    cdp.wait_for(detail, "the execution's detail with Propose a change", 5)
        .await;
    cdp.click("#proposal-execution button.propose").await;
    cdp.wait_for(
        "document.getElementById('message').textContent.includes('suggests no change')",
        "the bundle's answer that nothing more is needed",
        30,
    )
    .await;
    cdp.screenshot("proposals-page-after.png").await;
    gw.stop().await;
}
