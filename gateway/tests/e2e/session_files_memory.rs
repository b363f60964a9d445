//! A read and a write at their stated limit (16 MiB) in a session with a small memory limit (128
//! MB): the init's copies must not cost the session its sandbox. A write held the stdin line,
//! its parsed base64 and the decoded bytes at once (about 70 MB) and the sandbox died under it
//! (500, the next cell `killed`).

use crate::common;

use serde_json::json;

use common::TestGateway;

#[tokio::test(flavor = "multi_thread")]
async fn a_16_mib_read_and_write_in_a_128_mb_session_leave_it_open() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(
            &agent,
            "/v1/sessions",
            &json!({"language": "python", "limits": {"memory_mb": 128}}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    let cells = format!("/v1/sessions/{id}/executions");
    let (status, turn) = gw
        .post(
            &agent,
            &cells,
            &json!({"code": "import os\nopen('/tmp/big','wb').write(os.urandom(16 << 20))\nprint('ok')"}),
        )
        .await;
    assert_eq!(turn["status"], "succeeded", "{status} {turn}");
    let url = format!("{}/v1/sessions/{id}/files/content", gw.url);
    let response = gw
        .http
        .get(&url)
        .query(&[("path", "/tmp/big")])
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    if status != 200 {
        // The sandbox died under the read: the next cell is recorded `killed`.
        let (_, turn) = gw
            .post(&agent, &cells, &json!({"code": "print('after')"}))
            .await;
        panic!(
            "read: {status} {}; a cell then: {turn}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        );
    }
    assert_eq!(body.len(), 16 << 20);
    let response = gw
        .http
        .put(&url)
        .query(&[("path", "/tmp/big2")])
        .bearer_auth(&agent)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "write: {text}");
    let (status, turn) = gw
        .post(
            &agent,
            &cells,
            &json!({"code": "import os\nprint(os.path.getsize('/tmp/big2'))"}),
        )
        .await;
    assert_eq!(turn["status"], "succeeded", "{status} {turn}");
    assert_eq!(turn["stdout"], format!("{}\n", 16 << 20), "{turn}");
    let (status, turn) = gw
        .post(&agent, &cells, &json!({"code": "print('still here')"}))
        .await;
    assert_eq!(turn["status"], "succeeded", "{status} {turn}");
    let after = gw.session(&agent, &id).await;
    assert_eq!(after["status"], "ready", "{after}");
    gw.stop().await;
}
