//! Allowed traffic through a real Unix socket to upstreams in the test network namespace: plain
//! HTTP, TLS-style tunnels, the byte budget, and what the recorder is told.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use egress_proxy::{ReasonCode, Scheme};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn plain_http_goes_through_with_a_clean_head() {
    let upstream = http_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let mode = std::fs::metadata(&harness.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);

    let request = format!(
        "POST http://UPSTREAM.test:{port}/submit?token=s3cret HTTP/1.1\r\nHost: upstream.test:{port}\r\n\
         User-Agent: test\r\nProxy-Authorization: Basic c2VjcmV0\r\nX-Sandgate-Execution: ex_other\r\n\
         Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nContent-Length: 5\r\n\r\nhelloGET http://evil.test/ HTTP/1.1\r\n\r\n"
    );
    let response = harness.exchange_text(&request).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.ends_with("hello; body 5 bytes"), "{response}");

    let heads = upstream.seen.heads();
    assert_eq!(
        heads.len(),
        1,
        "exactly one request goes upstream: {heads:?}"
    );
    assert_eq!(
        heads[0],
        format!(
            "POST /submit?token=s3cret HTTP/1.1\r\nHost: upstream.test:{port}\r\nUser-Agent: test\r\n\
             Content-Length: 5\r\nConnection: close\r\n\r\n"
        )
    );
    let records = harness.recorder.settled(1).await;
    let attempt = &records[0].attempt;
    assert!(attempt.allow, "{attempt:#?}");
    assert_eq!(attempt.reason, ReasonCode::Allowed);
    assert_eq!(
        attempt.execution_id, "ex_test",
        "identity comes from the socket"
    );
    assert_eq!(attempt.scheme, Some(Scheme::Http));
    assert_eq!(
        attempt.path.as_deref(),
        Some("/submit"),
        "the query string is not recorded"
    );
    assert_eq!(attempt.address, Some(upstream.addr));
    let closed = &records[0].closes[0];
    assert_eq!(closed.reason, ReasonCode::Completed);
    assert_eq!(closed.bytes_up as usize, upstream.seen.bytes());
    assert_eq!(closed.bytes_down as usize, response.len());
}

#[tokio::test]
async fn redirects_are_passed_back_not_followed() {
    let upstream = http_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let response = harness
        .exchange_text(&format!(
            "GET http://upstream.test:{port}/redirect HTTP/1.1\r\nHost: upstream.test:{port}\r\n\r\n"
        ))
        .await;
    assert!(response.starts_with("HTTP/1.1 302 Found\r\n"), "{response}");
    assert!(response.contains("Location: http://169.254.169.254/latest/meta-data/"));
    let records = harness.recorder.settled(1).await;
    assert_eq!(records[0].attempt.path.as_deref(), Some("/redirect"));
    assert!(harness.resolver.lookups() == ["upstream.test"]);
}

#[tokio::test]
async fn a_tls_tunnel_relays_bytes_after_a_matching_client_hello() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .tls_ports(&[port])
        .start();
    let mut stream = harness.connect().await;
    stream
        .write_all(format!("CONNECT Upstream.Test.:{port} HTTP/1.1\r\nHost: upstream.test:{port}\r\nX-Sandgate-Execution: ex_other\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        read_head(&mut stream).await,
        "HTTP/1.1 200 Connection established\r\n\r\n"
    );
    let hello = hello::client_hello(Some("UPSTREAM.test"));
    stream.write_all(&hello).await.unwrap();
    assert_eq!(read_n(&mut stream, hello.len()).await, hello);
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (mut reader, mut writer) = stream.into_split();
    let send = async {
        writer.write_all(&payload).await.unwrap();
        writer.shutdown().await.unwrap();
    };
    let (echoed, ()) = tokio::join!(read_to_close(&mut reader), send);
    assert_eq!(echoed, payload);

    let records = harness.recorder.settled(1).await;
    let attempt = &records[0].attempt;
    assert!(attempt.allow);
    assert_eq!(attempt.scheme, Some(Scheme::Https));
    assert_eq!(attempt.host, "upstream.test");
    assert_eq!(attempt.sni.as_deref(), Some("UPSTREAM.test"));
    let closed = &records[0].closes[0];
    let total = (hello.len() + payload.len()) as u64;
    assert_eq!((closed.bytes_up, closed.bytes_down), (total, total));
    assert_eq!(closed.reason, ReasonCode::Completed);
    assert_eq!(upstream.seen.accepted(), 1);
}

#[tokio::test]
async fn a_plain_tunnel_on_another_port_is_opaque_but_recorded() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let mut stream = harness.connect().await;
    stream
        .write_all(format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\nearly").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        read_head(&mut stream).await,
        "HTTP/1.1 200 Connection established\r\n\r\n"
    );
    assert_eq!(read_n(&mut stream, 5).await, b"early");
    stream.write_all(b"SSH-2.0-x\r\n").await.unwrap();
    assert_eq!(read_n(&mut stream, 11).await, b"SSH-2.0-x\r\n");
    stream.shutdown().await.unwrap();
    read_to_close(&mut stream).await;
    let records = harness.recorder.settled(1).await;
    assert_eq!(records[0].attempt.scheme, Some(Scheme::Connect));
    assert_eq!(records[0].closes[0].bytes_up, 16);
}

#[tokio::test]
async fn the_byte_budget_spans_connections_and_is_enforced() {
    let upstream = http_upstream();
    let port = upstream.addr.port();
    let mut grant = grant(&["upstream.test"], &[port]);
    grant.max_bytes = 50_000;
    let harness = Setup::new(grant)
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let get = |path: &str| {
        format!(
            "GET http://upstream.test:{port}{path} HTTP/1.1\r\nHost: upstream.test:{port}\r\n\r\n"
        )
    };
    let small = harness.exchange(get("/bytes/1000").as_bytes()).await;
    assert!(small.ends_with(&[b'x'; 1000]));
    let big = harness.exchange(get("/bytes/1000000").as_bytes()).await;
    assert!(big.starts_with(b"HTTP/1.1 200 OK"));
    assert!(
        big.len() < 50_000,
        "the budget was overdrawn: {} bytes",
        big.len()
    );
    let after = harness.exchange_text(&get("/bytes/10")).await;
    assert!(after.starts_with("HTTP/1.1 403 "), "{after}");
    assert!(
        after.contains("sandgate-egress: egress.byte_limit: "),
        "{after}"
    );

    let records = harness.recorder.settled(3).await;
    assert_eq!(records[0].closes[0].reason, ReasonCode::Completed);
    assert_eq!(records[1].closes[0].reason, ReasonCode::ByteLimit);
    assert_eq!(records[2].attempt.reason, ReasonCode::ByteLimit);
    let used: u64 = records
        .iter()
        .map(|r| r.closes[0].bytes_up + r.closes[0].bytes_down)
        .sum();
    assert_eq!(used, 50_000);
    assert_eq!(harness.listener.as_ref().unwrap().bytes_used(), 50_000);
    assert_eq!(
        upstream.seen.accepted(),
        2,
        "no dial once the budget is spent"
    );
}

#[tokio::test]
async fn idle_tunnels_are_closed_and_recorded() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .limits(|limits| limits.idle_timeout = Duration::from_millis(300))
        .start();
    let mut stream = harness.connect().await;
    stream
        .write_all(format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_head(&mut stream).await;
    read_to_close(&mut stream).await;
    let records = harness.recorder.settled(1).await;
    assert_eq!(records[0].closes[0].reason, ReasonCode::IdleTimeout);
}

#[tokio::test]
async fn closing_the_listener_ends_its_connections_and_removes_the_socket() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let mut harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let mut stream = harness.connect().await;
    stream
        .write_all(format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_head(&mut stream).await;
    let listener = harness.listener.take().unwrap();
    assert_eq!(
        listener.close().await,
        0,
        "connections still running after close"
    );
    assert!(!harness.socket.exists(), "the socket outlived its listener");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut rest))
        .await
        .unwrap();
    let records = harness.recorder.settled(1).await;
    assert_eq!(records[0].closes[0].reason, ReasonCode::Shutdown);
    assert!(tokio::net::UnixStream::connect(&harness.socket)
        .await
        .is_err());
}
