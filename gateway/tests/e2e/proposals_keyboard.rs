//! The Proposals view with real key presses (CDP `Input.dispatchKeyEvent`, as a keyboard user
//! sends them), in headless Chromium, through the real gateway: a reviewer opens a held
//! execution's detail, proposes a change from it ("Propose a change": the bundle's suggestion),
//! and another reviewer approves it with Tab and Enter only. Screenshot:
//! `<target>/proposals-keyboard.png`.

use crate::browser;
use crate::common;

use serde_json::json;

use browser::{js, Browser, Cdp};
use common::{copy_of_shipped, fresh_database, TestGateway};

/// One key pressed and released, as the keyboard sends it.
async fn press(cdp: &mut Cdp, key: &str, code: u32) {
    let text = if key == "Enter" { "\r" } else { "" };
    for kind in ["keyDown", "keyUp"] {
        let mut event = json!({"type": kind, "key": key, "code": key,
            "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code});
        if kind == "keyDown" && !text.is_empty() {
            event["text"] = json!(text);
        }
        cdp.call("Input.dispatchKeyEvent", event).await;
    }
}

async fn focused(cdp: &mut Cdp) -> serde_json::Value {
    cdp.eval("document.activeElement && document.activeElement.id")
        .await
}

#[tokio::test]
async fn a_held_execution_becomes_a_proposal_approved_with_the_keyboard() {
    let browser = Browser::start().await;
    let policy = copy_of_shipped();
    let dir = policy.path().to_owned();
    let gw =
        TestGateway::start_with(Some(fresh_database().await), move |c| c.policy_dir = dir).await;
    let agent = gw.key("agent", "acme").await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    let unlisted = json!({"network": [{"host": "keyboard.example", "port": 443}]});
    let (status, held) = gw.execute(&agent, "python", "print(1)", unlisted).await;
    assert_eq!(status, 202, "{held}");
    let held = held["id"].as_str().unwrap().to_owned();

    // Alice: the held execution's detail, then "Propose a change".
    let mut cdp = browser.page().await;
    cdp.open(&format!("{}/ui/", gw.url)).await;
    cdp.use_key(&alice).await;
    let details = format!(
        "#executions tr[data-execution-id={}] button.details",
        js(&held)
    );
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&details)),
        "the held execution in the list",
        30,
    )
    .await;
    cdp.click(&details).await;
    cdp.wait_for(
        "!!document.querySelector('#executions button.propose')",
        "the held execution's detail with Propose a change",
        30,
    )
    .await;
    cdp.click("#executions button.propose").await;
    cdp.wait_for(
        &format!(
            "document.getElementById('message').textContent.includes('opened from ' + {})",
            js(&held)
        ),
        "the proposal opened from the held execution",
        60,
    )
    .await;
    let (_, open) = gw.get(&bob, "/v1/policy/proposals?status=open").await;
    let proposal = open["proposals"][0].clone();
    assert_eq!(proposal["source_execution"], held, "{open}");
    assert_eq!(proposal["tests_passed"], true, "{proposal}");
    assert_eq!(
        proposal["evidence"]["replay"]["review_changes"]["examples"],
        json!([{"kind": "execution", "id": held}]),
        "{proposal}"
    );

    // Bob: the list's Review button, the comment, then Tab to Approve and Enter.
    // Alice's page shows the list and the proposal already: both are marked, so that the
    // waits below are for what Bob's key lists and what Enter opens (a key press on an
    // element that is then replaced is lost).
    cdp.eval(
        "document.querySelector('#proposals-list table.proposals button').dataset.old = '1'; \
         document.getElementById('proposal-approve').dataset.old = '1'; true",
    )
    .await;
    cdp.use_key(&bob).await;
    cdp.wait_for(
        "(document.querySelector('#proposals-list table.proposals button') \
         || {dataset: {old: '1'}}).dataset.old !== '1'",
        "the open proposal in Bob's list",
        30,
    )
    .await;
    cdp.eval("document.querySelector('#proposals-list table.proposals button').focus(); true")
        .await;
    press(&mut cdp, "Enter", 13).await;
    cdp.wait_for(
        "(document.getElementById('proposal-approve') || {dataset: {old: '1'}}).dataset.old !== '1'",
        "the proposal's detail, opened with Enter",
        30,
    )
    .await;
    cdp.eval("document.getElementById('proposal-comment').focus(); true")
        .await;
    cdp.call(
        "Input.insertText",
        json!({"text": "keyboard.example is ours"}),
    )
    .await;
    press(&mut cdp, "Tab", 9).await;
    assert_eq!(focused(&mut cdp).await, json!("proposal-approve"));
    cdp.screenshot("proposals-keyboard.png").await;
    press(&mut cdp, "Enter", 13).await;
    cdp.wait_for(
        "document.getElementById('message').textContent.includes('approved')",
        "the approval, by the keyboard",
        60,
    )
    .await;
    let id = proposal["id"].as_str().unwrap();
    let (_, after) = gw.get(&bob, &format!("/v1/policy/proposals/{id}")).await;
    assert_eq!(after["status"], "approved", "{after}");
    assert_eq!(after["comment"], "keyboard.example is ours");
    gw.stop().await;
}

/// A replay example that is a session opening opens that session (its state and executions),
/// not an execution lookup that would fail.
#[tokio::test]
async fn a_session_example_opens_the_session() {
    let browser = Browser::start().await;
    let policy = copy_of_shipped();
    let dir = policy.path().to_owned();
    let gw =
        TestGateway::start_with(Some(fresh_database().await), move |c| c.policy_dir = dir).await;
    let agent = gw.key("agent", "acme").await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();
    let (status, closed) = gw.delete(&agent, &format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200, "{closed}");
    let patch = json!({"data/tenants.yaml": {"tenants": {"acme": {"limits": {"memory_mb": 640}}}}});
    let (status, proposal) = gw
        .post(
            &alice,
            "/v1/policy/proposals",
            &json!({"title": "more memory", "patch": patch}),
        )
        .await;
    assert_eq!(status, 201, "{proposal}");
    assert_eq!(
        proposal["evidence"]["replay"]["limit_changes"]["examples"],
        json!([{"kind": "session", "id": session}]),
        "{proposal}"
    );

    let mut cdp = browser.page().await;
    cdp.open(&format!("{}/ui/", gw.url)).await;
    cdp.use_key(&bob).await;
    cdp.wait_for(
        "!!document.querySelector('#proposals-list table.proposals button')",
        "the open proposal in the list",
        30,
    )
    .await;
    cdp.click("#proposals-list table.proposals button").await;
    let example = format!(
        "#proposal button[aria-label={}]",
        js(&format!("open session {session}"))
    );
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&example)),
        "the session as an example",
        30,
    )
    .await;
    cdp.click(&example).await;
    let view = format!(
        "#proposal-execution .session-view[data-session-id={}]",
        js(&session)
    );
    cdp.wait_for(
        &format!(
            "(document.querySelector({}) || {{}}).innerText?.includes('Session ' + {})",
            js(&view),
            js(&session)
        ),
        "the session's own view",
        30,
    )
    .await;
    let shown = cdp.text(&view).await;
    assert!(shown.contains("closed"), "{shown}");
    assert!(!shown.contains("not found"), "{shown}");
    cdp.screenshot("proposals-session-example.png").await;
    gw.stop().await;
}
