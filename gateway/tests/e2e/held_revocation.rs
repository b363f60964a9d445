//! A request held for review must not outlive its key's revocation, even when the key is revoked
//! while the request is still on its way (its headers authenticated, its body not yet read):
//! revoking withdraws what is pending, so what is held after that must be refused.

use crate::common;

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::TestGateway;

/// Sends `path`'s headers as `agent`, revokes the key, then sends the body: the answer's status
/// line.
async fn revoked_mid_body(
    gw: &TestGateway,
    (agent_id, agent): (&str, &str),
    path: &str,
    body: &str,
) -> String {
    let admin = gw.key_of("admin", "ops", "olga").await;
    let addr = gw.url.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {agent}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body.as_bytes()[..1]).await.unwrap();
    stream.flush().await.unwrap();
    // The headers authenticated; the body is still on its way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let revoked = gw
        .http
        .delete(format!("{}/v1/keys/{agent_id}", gw.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status().as_u16(), 200);
    stream.write_all(&body.as_bytes()[1..]).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_revoked_while_its_request_body_is_on_the_way_gets_nothing_held() {
    let gw = TestGateway::start().await;
    let (_, reviewer) = gw.key_with_id("reviewer", "acme", "rita").await;
    // Both sent to review by the shipped policy (a destination outside acme's allowlist).
    let unlisted = json!([{"host": "review.example", "port": 443}]);
    let execution = json!({"language": "python", "code": "print('held')", "wait": false,
                           "network": unlisted});
    let session = json!({"language": "python", "network": unlisted});
    for (path, body) in [("/v1/executions", execution), ("/v1/sessions", session)] {
        let (agent_id, agent) = gw.key_with_id("agent", "acme", "ana").await;
        let status = revoked_mid_body(&gw, (&agent_id, &agent), path, &body.to_string()).await;
        assert!(status.contains(" 403 "), "{path}: {status}");

        // Nothing of the revoked key waits for a reviewer, so nothing of it can be approved.
        let (_, pending) = gw.get(&reviewer, "/v1/approvals?status=pending").await;
        let pending = pending["approvals"].as_array().cloned().unwrap_or_default();
        for approval in &pending {
            let id = approval["id"].as_str().unwrap();
            let (status, decided) = gw
                .post(
                    &reviewer,
                    &format!("/v1/approvals/{id}"),
                    &json!({"decision": "approve"}),
                )
                .await;
            assert_ne!(
                status, 200,
                "{path}: a revoked key's request was approved: {decided}"
            );
        }
        assert!(
            pending.is_empty(),
            "{path}: held after its key was revoked: {pending:?}"
        );
    }
    gw.stop().await;
}
