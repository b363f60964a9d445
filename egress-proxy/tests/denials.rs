//! Attempts the proxy must refuse, through a real Unix socket and the real policy bundle: each
//! is answered (never a hang), recorded exactly once, and reaches no upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use egress_proxy::{ReasonCode, Scheme};
use support::*;
use tokio::io::AsyncWriteExt;

/// The status line and the uniform body of a denial.
fn assert_denied(response: &str, status: u16, reason: ReasonCode) {
    assert!(
        response.starts_with(&format!("HTTP/1.1 {status} ")),
        "expected {status} for {reason}: {response:?}"
    );
    let body = format!("\r\n\r\nsandgate-egress: {}: ", reason.code());
    assert!(
        response.contains(&body),
        "expected {body:?} in {response:?}"
    );
    assert!(response.ends_with('\n') && response.matches('\n').count() > 2);
}

#[tokio::test]
async fn a_host_outside_the_grant_is_denied_and_never_resolved() {
    let harness = Setup::new(grant(&["pypi.org"], &[443])).start();
    let response = harness
        .exchange_text(
            "CONNECT secret123.exfil.test:443 HTTP/1.1\r\nHost: secret123.exfil.test:443\r\n\r\n",
        )
        .await;
    assert_denied(&response, 403, ReasonCode::HostNotGranted);
    assert!(response.contains("secret123.exfil.test is not granted to execution ex_test"));
    let response = harness
        .exchange_text("GET http://Other.Exfil.Test./x HTTP/1.1\r\nHost: other.exfil.test\r\n\r\n")
        .await;
    assert_denied(&response, 403, ReasonCode::HostNotGranted);
    // A granted host on another port is denied by the policy too.
    let response = harness
        .exchange_text("CONNECT pypi.org:22 HTTP/1.1\r\n\r\n")
        .await;
    assert_denied(&response, 403, ReasonCode::PortNotGranted);

    assert_eq!(
        harness.resolver.lookups(),
        Vec::<String>::new(),
        "a denied name was looked up"
    );
    let records = harness.recorder.settled(3).await;
    let first = &records[0].attempt;
    assert_eq!(
        (first.host.as_str(), first.port, first.allow),
        ("secret123.exfil.test", 443, false)
    );
    assert_eq!(first.reason, ReasonCode::HostNotGranted);
    assert_eq!(first.scheme, Some(Scheme::Https));
    assert_eq!(first.execution_id, "ex_test");
    assert_eq!(first.policy_reasons[0].code, "egress.host_not_granted");
    let second = &records[1].attempt;
    assert_eq!(second.host, "other.exfil.test");
    assert_eq!(
        (second.method.as_deref(), second.path.as_deref()),
        (Some("GET"), Some("/x"))
    );
    assert_eq!(records[2].attempt.reason, ReasonCode::PortNotGranted);
    assert!(records
        .iter()
        .all(|r| r.closes[0].bytes_up == 0 && r.closes[0].bytes_down == 0));
}

#[tokio::test]
async fn metadata_and_loopback_in_every_spelling_are_denied() {
    // Not granted: the policy refuses them on the canonical name, before any address check.
    let harness = Setup::new(grant(&["pypi.org"], &[80, 443])).start();
    let targets = [
        ("169.254.169.254:80", "169.254.169.254"),
        ("[::ffff:169.254.169.254]:80", "169.254.169.254"),
        ("[::ffff:a9fe:a9fe]:80", "169.254.169.254"),
        ("2130706433:80", "127.0.0.1"),
        ("0x7f.1:80", "127.0.0.1"),
        ("127.1:80", "127.0.0.1"),
        ("0177.0.0.1:80", "127.0.0.1"),
        ("127.0.0.1.:80", "127.0.0.1"),
        ("[::1]:80", "::1"),
        ("[64:ff9b::a9fe:a9fe]:80", "64:ff9b::a9fe:a9fe"),
    ];
    for (target, canonical) in targets {
        let response = harness
            .exchange_text(&format!("CONNECT {target} HTTP/1.1\r\n\r\n"))
            .await;
        assert_denied(&response, 403, ReasonCode::HostNotGranted);
        assert!(response.contains(canonical), "{target}: {response}");
    }
    let records = harness.recorder.settled(targets.len()).await;
    for (record, (_, canonical)) in records.iter().zip(targets) {
        assert_eq!(record.attempt.host, canonical);
    }

    // Granted by literal: the address table still refuses them, whatever the grant says.
    let harness = Setup::new(grant(&["169.254.169.254", "127.0.0.1"], &[80])).start();
    for target in [
        "169.254.169.254",
        "[::ffff:169.254.169.254]",
        "0xa9fea9fe",
        "2130706433",
        "0x7f.1",
        "127.1",
    ] {
        let response = harness
            .exchange_text(&format!(
                "GET http://{target}/latest/meta-data/ HTTP/1.1\r\nHost: {target}\r\n\r\n"
            ))
            .await;
        assert_denied(&response, 403, ReasonCode::AddressDenied);
        assert!(response.contains("always denied"), "{target}: {response}");
    }
    let records = harness.recorder.settled(6).await;
    assert_eq!(
        records[0].attempt.address,
        Some("169.254.169.254:80".parse().unwrap())
    );
    assert_eq!(
        records[3].attempt.address,
        Some("127.0.0.1:80".parse().unwrap())
    );
    assert!(
        harness.resolver.lookups().is_empty(),
        "a literal was resolved"
    );
}

#[tokio::test]
async fn a_granted_name_resolving_to_a_private_or_loopback_address_is_denied() {
    let harness = Setup::new(grant(
        &[
            "rebind.test",
            "private.test",
            "mixed.test",
            "cgnat.test",
            "self.test",
            "mapped.test",
        ],
        &[443, 8080],
    ))
    .name("rebind.test", &["127.0.0.1"])
    .name("private.test", &["10.0.0.5"])
    .name("mixed.test", &[UPSTREAM_IP, "169.254.169.254"])
    .name("cgnat.test", &["100.100.100.200"])
    .name("self.test", &[HOST_SIDE_IP])
    .name("mapped.test", &["::ffff:10.0.0.5"])
    .start();
    for (name, address, why) in [
        ("rebind.test", "127.0.0.1", "loopback"),
        ("private.test", "10.0.0.5", "not named by the grant"),
        ("mixed.test", "169.254.169.254", "link-local"),
        ("cgnat.test", "100.100.100.200", "shared address space"),
        ("self.test", HOST_SIDE_IP, "gateway's own"),
        ("mapped.test", "::ffff:10.0.0.5", "IPv4-mapped"),
    ] {
        let response = harness
            .exchange_text(&format!("CONNECT {name}:8080 HTTP/1.1\r\n\r\n"))
            .await;
        assert_denied(&response, 403, ReasonCode::AddressDenied);
        assert!(
            response.contains(&format!("{name} resolves to {address}")),
            "{response}"
        );
        assert!(response.contains(why), "{name}: {response}");
    }
    let records = harness.recorder.settled(6).await;
    assert_eq!(
        records[1].attempt.address,
        Some("10.0.0.5:8080".parse().unwrap())
    );
    assert_eq!(
        harness.resolver.lookups(),
        [
            "rebind.test",
            "private.test",
            "mixed.test",
            "cgnat.test",
            "self.test",
            "mapped.test"
        ]
    );
}

#[tokio::test]
async fn sni_other_than_the_connect_host_closes_before_any_byte_reaches_the_upstream() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .tls_ports(&[port])
        .start();
    let split = hello::split_into_two_records(&hello::client_hello(Some("upstream.test")), 30);
    let cases: Vec<(Vec<u8>, ReasonCode)> = vec![
        (
            hello::client_hello(Some("evil.test")),
            ReasonCode::SniMismatch,
        ),
        (
            hello::client_hello(Some("upstream.test.evil.test")),
            ReasonCode::SniMismatch,
        ),
        (hello::client_hello(None), ReasonCode::SniMissing),
        (
            hello::client_hello_with(&[(0, b"upstream.test"), (0, b"evil.test")], 1),
            ReasonCode::SniUnreadable,
        ),
        (split, ReasonCode::SniUnreadable),
        (
            b"GET / HTTP/1.1\r\nHost: upstream.test\r\n\r\n".to_vec(),
            ReasonCode::SniUnreadable,
        ),
        (
            b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(),
            ReasonCode::SniUnreadable,
        ),
    ];
    for (first_bytes, _) in &cases {
        let mut stream = harness.connect().await;
        let connect = format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n");
        stream.write_all(connect.as_bytes()).await.unwrap();
        assert_eq!(
            read_head(&mut stream).await,
            "HTTP/1.1 200 Connection established\r\n\r\n"
        );
        stream.write_all(first_bytes).await.unwrap();
        let rest = read_to_close(&mut stream).await;
        assert!(
            rest.is_empty() || rest[0] == 21,
            "only a TLS alert may follow: {rest:?}"
        );
    }
    // Optimistic: the hello in the same write as the CONNECT.
    let mut optimistic = format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n").into_bytes();
    optimistic.extend_from_slice(&hello::client_hello(Some("evil.test")));
    harness.exchange(&optimistic).await;

    let records = harness.recorder.settled(cases.len() + 1).await;
    for (record, (_, reason)) in records.iter().zip(&cases) {
        assert_eq!(record.attempt.reason, *reason, "{record:#?}");
        assert!(!record.attempt.allow);
    }
    assert_eq!(records[0].attempt.sni.as_deref(), Some("evil.test"));
    assert_eq!(records[0].attempt.address, Some(upstream.addr));
    assert_eq!(records[cases.len()].attempt.reason, ReasonCode::SniMismatch);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(upstream.seen.accepted(), 0, "the upstream was dialled");
}

#[tokio::test]
async fn ambiguous_or_lying_plain_requests_are_refused_before_dialling() {
    let upstream = http_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let target = format!("http://upstream.test:{port}/");
    let host = format!("upstream.test:{port}");
    let cases = [
        (format!("POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400, ReasonCode::Smuggling),
        (format!("POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"), 400, ReasonCode::Smuggling),
        (format!("POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked, identity\r\n\r\n"), 400, ReasonCode::Smuggling),
        (format!("GET {target} HTTP/1.1\r\nHost: evil.test\r\n\r\n"), 400, ReasonCode::HostMismatch),
        (format!("GET {target} HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n"), 400, ReasonCode::HostMismatch),
        (format!("GET {target} HTTP/1.1\r\n\r\n"), 400, ReasonCode::HostMismatch),
        ("GET /index.html HTTP/1.1\r\nHost: upstream.test\r\n\r\n".to_string(), 400, ReasonCode::BadRequest),
        (format!("GET https://upstream.test:{port}/ HTTP/1.1\r\n\r\n"), 400, ReasonCode::BadRequest),
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(), 400, ReasonCode::BadRequest),
        ("CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\n\r\n".to_string(), 400, ReasonCode::HostInvalid),
        ("CONNECT evil.test\r\n.upstream.test:443 HTTP/1.1\r\n\r\n".to_string(), 400, ReasonCode::BadRequest),
        ("\u{16}\u{3}\u{1}\u{0}\u{5}hello".to_string(), 400, ReasonCode::BadRequest),
    ];
    for (request, status, reason) in &cases {
        let response = harness.exchange_text(request).await;
        assert_denied(&response, *status, *reason);
    }
    let oversized = format!(
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    assert_denied(
        &harness.exchange_text(&oversized).await,
        400,
        ReasonCode::BadRequest,
    );

    let records = harness.recorder.settled(cases.len() + 1).await;
    assert_eq!(records[0].attempt.host, "upstream.test");
    assert_eq!(records[9].attempt.host, "[fe80::1%25eth0]");
    assert_eq!(
        records[8].attempt.host, "",
        "a malformed head names no host"
    );
    assert_eq!(upstream.seen.accepted(), 0);
    assert!(harness.resolver.lookups().is_empty());
}

#[tokio::test]
async fn when_the_audit_log_is_down_nothing_is_dialled() {
    let upstream = http_upstream();
    let port = upstream.addr.port();
    let harness = Setup::new(grant(&["upstream.test"], &[port]))
        .name("upstream.test", &[UPSTREAM_IP])
        .tls_ports(&[port])
        .start();
    harness.recorder.fail.store(true, Ordering::SeqCst);
    let response = harness
        .exchange_text(&format!(
            "GET http://upstream.test:{port}/ HTTP/1.1\r\nHost: upstream.test:{port}\r\n\r\n"
        ))
        .await;
    assert_denied(&response, 503, ReasonCode::AuditUnavailable);
    // A denial is not answered as a denial either when it cannot be recorded.
    let response = harness
        .exchange_text("CONNECT other.test:443 HTTP/1.1\r\n\r\n")
        .await;
    assert_denied(&response, 503, ReasonCode::AuditUnavailable);
    // TLS port: the tunnel opened, the hello was right, the record failed: closed with an alert.
    let mut stream = harness.connect().await;
    stream
        .write_all(format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_head(&mut stream).await;
    stream
        .write_all(&hello::client_hello(Some("upstream.test")))
        .await
        .unwrap();
    assert_eq!(read_to_close(&mut stream).await, [21, 3, 3, 0, 2, 2, 80]);

    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(upstream.seen.accepted(), 0, "dialled without an audit row");
    assert!(harness.recorder.records().is_empty());
}

#[tokio::test]
async fn connection_limit_and_slow_clients_are_answered() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let mut grant = grant(&["upstream.test"], &[port]);
    grant.max_connections = 1;
    let harness = Setup::new(grant)
        .name("upstream.test", &[UPSTREAM_IP])
        .limits(|limits| limits.header_read_timeout = Duration::from_millis(500))
        .start();
    let mut open = harness.connect().await;
    open.write_all(format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(read_head(&mut open).await.starts_with("HTTP/1.1 200"));
    let response = harness
        .exchange_text(&format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n"))
        .await;
    assert_denied(&response, 429, ReasonCode::TooManyConnections);
    drop(open);
    harness.recorder.settled(2).await;

    // A head trickled too slowly is answered 408 once the header-read timeout passes.
    let mut slow = harness.connect().await;
    slow.write_all(b"CONNECT upstream.te").await.unwrap();
    let response = String::from_utf8_lossy(&read_to_close(&mut slow).await).to_string();
    assert_denied(&response, 408, ReasonCode::ClientTimeout);
    let records = harness.recorder.settled(3).await;
    assert_eq!(records[1].attempt.reason, ReasonCode::TooManyConnections);
    assert_eq!(records[1].attempt.host, "upstream.test");
    assert_eq!(upstream.seen.accepted(), 1);
}

#[tokio::test]
async fn a_flood_over_the_connection_limit_is_refused_without_reading() {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let mut grant = grant(&["upstream.test"], &[port]);
    grant.max_connections = 1;
    let harness = Setup::new(grant)
        .name("upstream.test", &[UPSTREAM_IP])
        .start();
    let mut open = harness.connect().await;
    open.write_all(format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(read_head(&mut open).await.starts_with("HTTP/1.1 200"));
    // Over the limit and silent: each is read (for the record) until it gives up.
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(harness.connect().await);
    }
    // Past those, refused at once: nothing was sent and the answer is already there.
    let mut flood = harness.connect().await;
    let started = std::time::Instant::now();
    let response = String::from_utf8_lossy(&read_to_close(&mut flood).await).to_string();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_denied(&response, 429, ReasonCode::TooManyConnections);
    drop(idle);
    drop(open);
    let records = harness.recorder.settled(18).await;
    assert_eq!(records.iter().filter(|r| r.attempt.allow).count(), 1);
    assert!(records
        .iter()
        .filter(|r| !r.attempt.allow)
        .all(|r| r.attempt.reason == ReasonCode::TooManyConnections));
}

#[tokio::test]
async fn upstream_failures_are_answered_and_recorded() {
    // A port in the test network with nothing listening: the dial is refused.
    let closed_port = listen_in_netns().local_addr().unwrap().port();
    let harness = Setup::new(grant(&["missing.test", "closed.test"], &[closed_port]))
        .name("closed.test", &[UPSTREAM_IP])
        .start();
    let response = harness
        .exchange_text(&format!(
            "CONNECT missing.test:{closed_port} HTTP/1.1\r\n\r\n"
        ))
        .await;
    assert_denied(&response, 502, ReasonCode::DnsFailed);
    let response = harness
        .exchange_text(&format!(
            "GET http://closed.test:{closed_port}/ HTTP/1.1\r\nHost: closed.test:{closed_port}\r\n\r\n"
        ))
        .await;
    assert_denied(&response, 502, ReasonCode::UpstreamFailed);
    let records = harness.recorder.settled(2).await;
    assert!(!records[0].attempt.allow);
    assert_eq!(records[0].attempt.reason, ReasonCode::DnsFailed);
    // The dial was allowed and recorded; it failed, and the close says so.
    assert!(records[1].attempt.allow);
    assert_eq!(records[1].closes[0].reason, ReasonCode::UpstreamFailed);
    assert!(records[1].closes[0]
        .error
        .as_deref()
        .unwrap_or("")
        .contains("refused"));
}

#[tokio::test]
async fn past_its_denial_bounds_an_execution_is_refused_and_only_counted() {
    // The grant names the bounds (the decision's network grant); 5 rows, then counts.
    let mut granted = grant(&["pypi.org"], &[443]);
    granted.max_denied = Some(5);
    granted.max_denied_per_s = Some(1000);
    let mut harness = Setup::new(granted).start();
    for attempt in 0..20 {
        let response = harness
            .exchange_text(&format!(
                "CONNECT flood{attempt}.exfil.test:443 HTTP/1.1\r\n\r\n"
            ))
            .await;
        if attempt < 5 {
            assert_denied(&response, 403, ReasonCode::HostNotGranted);
        } else {
            assert_denied(&response, 429, ReasonCode::TooManyDenials);
        }
    }
    let records = harness.recorder.settled(5).await;
    assert_eq!(records.len(), 5, "only the first five have rows");
    // Closing the listener records the last summary: every attempt is a row or a count.
    harness.listener.take().unwrap().close().await;
    let summaries = harness.recorder.suppressed.lock().unwrap().clone();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(summaries[0].count, 15);
    assert_eq!(summaries[0].execution_id, "ex_test");
    assert_eq!(
        summaries[0].by_reason,
        [("egress.host_not_granted".to_owned(), 15)]
    );
}

#[tokio::test]
async fn the_default_rate_bounds_a_burst_of_denials() {
    let mut harness = Setup::new(grant(&["pypi.org"], &[443])).start();
    let burst = 3 * egress_proxy::DEFAULT_MAX_DENIED_PER_S as usize;
    let mut refused = 0;
    for attempt in 0..burst {
        let response = harness
            .exchange_text(&format!(
                "CONNECT b{attempt}.exfil.test:443 HTTP/1.1\r\n\r\n"
            ))
            .await;
        refused += usize::from(response.contains("egress.too_many_denials"));
    }
    harness.listener.take().unwrap().close().await;
    let rows = harness.recorder.records().len();
    let counted: u64 = harness
        .recorder
        .suppressed
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.count)
        .sum();
    assert!(refused >= 1, "a burst past the rate is refused");
    assert_eq!(
        rows + counted as usize,
        burst,
        "every attempt is a row or a count"
    );
    assert_eq!(counted as usize, refused);
}
