//! Measures (does not assert) the proxy against a direct connection to the same upstream in the
//! `sgtest` network namespace, in one run (DESIGN 8: throughput >= 0.9 x direct, added CONNECT
//! latency p50 <= 0.5 ms):
//! - bulk download through a TLS-port CONNECT tunnel (ClientHello checked, then relayed) versus
//!   a direct TCP connection, best of several rounds, alternating: once at memory speed (the
//!   veth pair unshaped: CPU-bound, every byte crosses one more socket pair through the proxy)
//!   and once over a link shaped to 1 Gbit/s (`tc tbf` on the namespace side, removed after);
//! - CONNECT latency: CONNECT, `200`, ClientHello, first echoed byte, versus TCP connect,
//!   ClientHello, first echoed byte; p50 and p99 of each and the difference.
//!
//! `cargo bench -p egress-proxy --bench throughput` (root: it brings up the namespace). Sizes
//! can be changed with SANDGATE_BENCH_MB and SANDGATE_BENCH_CONNECTS.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is a failure report

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

const ROUNDS: usize = 5;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An upstream that reads the first bytes (the hello), then sends `size` bytes and closes.
fn bulk_upstream(size: usize) -> SocketAddr {
    let listener = listen_in_netns();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let mut first = [0u8; 4096];
                if stream.read(&mut first).await.unwrap_or(0) == 0 {
                    return;
                }
                let block = vec![0x5a_u8; 256 * 1024];
                let mut left = size;
                while left > 0 {
                    let take = left.min(block.len());
                    if stream.write_all(&block[..take]).await.is_err() {
                        return;
                    }
                    left -= take;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

async fn drain<R: AsyncRead + Unpin>(stream: &mut R) -> usize {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n,
        }
    }
}

async fn open_tunnel(harness: &Harness, port: u16) -> UnixStream {
    let mut stream = harness.connect().await;
    let connect = format!("CONNECT upstream.test:{port} HTTP/1.1\r\n\r\n");
    stream.write_all(connect.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

async fn hello_round_trip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, hello: &[u8]) {
    stream.write_all(hello).await.unwrap();
    let mut first = [0u8; 1];
    stream.read_exact(&mut first).await.unwrap();
}

fn mb_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

async fn throughput(size: usize) -> (f64, f64) {
    let addr = bulk_upstream(size);
    let port = addr.port();
    let mut grant = grant(&["upstream.test"], &[port]);
    grant.max_bytes = u64::MAX;
    grant.max_connections = 64;
    let harness = Setup::new(grant)
        .name("upstream.test", &[UPSTREAM_IP])
        .tls_ports(&[port])
        .start();
    let hello = hello::client_hello(Some("upstream.test"));
    let (mut best_direct, mut best_proxy) = (0f64, 0f64);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut direct = TcpStream::connect(addr).await.unwrap();
        direct.write_all(&hello).await.unwrap();
        let got = drain(&mut direct).await;
        assert_eq!(got, size);
        best_direct = best_direct.max(mb_per_s(got, started.elapsed()));

        let started = Instant::now();
        let mut tunnel = open_tunnel(&harness, port).await;
        tunnel.write_all(&hello).await.unwrap();
        let got = drain(&mut tunnel).await;
        assert_eq!(got, size);
        best_proxy = best_proxy.max(mb_per_s(got, started.elapsed()));
    }
    (best_direct, best_proxy)
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

async fn connect_latency(count: usize) -> (Vec<Duration>, Vec<Duration>) {
    let upstream = echo_upstream();
    let port = upstream.addr.port();
    let mut grant = grant(&["upstream.test"], &[port]);
    grant.max_connections = 64;
    let harness = Setup::new(grant)
        .name("upstream.test", &[UPSTREAM_IP])
        .tls_ports(&[port])
        .start();
    let hello = hello::client_hello(Some("upstream.test"));
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let started = Instant::now();
        let mut stream = TcpStream::connect(upstream.addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        hello_round_trip(&mut stream, &hello).await;
        direct.push(started.elapsed());
        drop(stream);

        let started = Instant::now();
        let mut stream = open_tunnel(&harness, port).await;
        hello_round_trip(&mut stream, &hello).await;
        proxied.push(started.elapsed());
    }
    (direct, proxied)
}

/// Shapes (or unshapes) the namespace side of the veth pair: downloads leave through it.
fn shape(rate: Option<&str>) {
    let mut command = std::process::Command::new("ip");
    command.args(["netns", "exec", "sgtest", "tc", "qdisc"]);
    match rate {
        Some(rate) => command.args([
            "replace", "dev", "sg-ns", "root", "tbf", "rate", rate, "burst", "512kb", "latency",
            "50ms",
        ]),
        // Deleting when nothing is installed fails; that is the state wanted.
        None => command
            .args(["del", "dev", "sg-ns", "root"])
            .stderr(std::process::Stdio::null()),
    };
    let status = command.status().expect("running tc");
    assert!(status.success() || rate.is_none(), "tc failed: {status}");
}

fn main() {
    let size = env_usize("SANDGATE_BENCH_MB", 256) << 20;
    let connects = env_usize("SANDGATE_BENCH_CONNECTS", 500);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        netns_up();
        shape(None);
        let (direct, proxied) = throughput(size).await;
        println!(
            "bulk download, unshaped veth ({} MiB, best of {ROUNDS}): direct {direct:.0} MB/s, \
             proxy {proxied:.0} MB/s, ratio {:.3} (target >= 0.9)",
            size >> 20,
            proxied / direct
        );
        shape(Some("1gbit"));
        let shaped_size = size / 4;
        let (direct, proxied) = throughput(shaped_size).await;
        shape(None);
        println!(
            "bulk download, 1 Gbit/s link ({} MiB, best of {ROUNDS}): direct {direct:.0} MB/s, \
             proxy {proxied:.0} MB/s, ratio {:.3} (target >= 0.9)",
            shaped_size >> 20,
            proxied / direct
        );
        let (mut direct, mut proxied) = connect_latency(connects).await;
        let (d50, p50) = (percentile(&mut direct, 0.5), percentile(&mut proxied, 0.5));
        let (d99, p99) = (
            percentile(&mut direct, 0.99),
            percentile(&mut proxied, 0.99),
        );
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "connect + first byte ({connects} runs): direct p50 {:.0} us p99 {:.0} us; \
             proxy (CONNECT, 200, SNI check, audit, dial) p50 {:.0} us p99 {:.0} us",
            us(d50),
            us(d99),
            us(p50),
            us(p99)
        );
        println!(
            "added CONNECT latency p50 {:.0} us (target <= 500 us), ratio {:.2}",
            us(p50) - us(d50),
            p50.as_secs_f64() / d50.as_secs_f64()
        );
    });
}
