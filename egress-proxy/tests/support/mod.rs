//! What the integration tests share: the test network, upstream servers inside it, a recorder
//! that keeps what it was told, and a proxy serving one execution on a real Unix socket.
//!
//! Upstreams live in network namespace `sgtest` (scripts/netns.sh), at 198.51.100.2, so the
//! proxy reaches them through a veth pair like any outside host: loopback, which the proxy always
//! denies, is never needed, and no traffic leaves this machine. A listener is put in the
//! namespace by binding it from a thread that has joined the namespace (`setns`); the socket
//! stays there while the test's runtime serves it.

#![allow(dead_code)]

pub mod hello;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use egress_proxy::{
    Attempt, Closed, ConnectionId, ConnectionRecorder, EgressProxy, ExecutionGrant,
    ExecutionLimits, ExecutionListener, InspectedRequest, ProxyConfig, RecordError, RequestDone,
    RequestId, StaticResolver, Suppressed,
};
use futures_util::future::BoxFuture;
use policy_engine::{HostRule, NetworkGrant, PolicyEngine};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;

/// The upstream side of the test network.
pub const UPSTREAM_IP: &str = "198.51.100.2";
/// The host side of the test network: one of "the gateway's own" addresses in these tests.
pub const HOST_SIDE_IP: &str = "198.51.100.1";
/// How long any single step of a test may wait.
pub const STEP: Duration = Duration::from_secs(10);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Brings the test network up once per test binary; fails the test (never skips it) when that
/// is impossible.
pub fn netns_up() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let result = UP.get_or_init(|| {
        let script = repo_root().join("scripts/netns.sh");
        let output = std::process::Command::new("bash")
            .arg(&script)
            .arg("up")
            .output()
            .map_err(|err| format!("running {}: {err}", script.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} up failed ({}): {}{}",
                script.display(),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    });
    if let Err(err) = result {
        panic!(
            "these tests need the sgtest network namespace (root and iproute2 with veth): {err}"
        );
    }
}

/// A TCP listener on 198.51.100.2 inside the `sgtest` namespace, on a free port.
pub fn listen_in_netns() -> TcpListener {
    netns_up();
    let std_listener = std::thread::spawn(|| -> Result<std::net::TcpListener, String> {
        let ns = std::fs::File::open("/run/netns/sgtest")
            .map_err(|err| format!("opening /run/netns/sgtest: {err}"))?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|err| format!("joining the sgtest namespace: {err}"))?;
        let listener = std::net::TcpListener::bind((UPSTREAM_IP, 0))
            .map_err(|err| format!("binding {UPSTREAM_IP}:0 in sgtest: {err}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|err| err.to_string())?;
        Ok(listener)
    })
    .join()
    .expect("the namespace thread panicked")
    .unwrap_or_else(|err| panic!("cannot start an upstream in the test network: {err}"));
    TcpListener::from_std(std_listener).expect("registering the upstream listener")
}

/// What an upstream saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub accepted: AtomicUsize,
    pub bytes: AtomicUsize,
    pub heads: Mutex<Vec<String>>,
}

impl Seen {
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// An upstream in the test network; stops with the test's runtime.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
}

/// A TCP echo server: every byte received is sent back.
pub fn echo_upstream() -> Upstream {
    let listener = listen_in_netns();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counters = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counters.accepted.fetch_add(1, Ordering::SeqCst);
            let counters = counters.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    counters.bytes.fetch_add(n, Ordering::SeqCst);
                    if stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Upstream { addr, seen }
}

/// A small HTTP/1.1 server: `/bytes/N` answers N bytes, `/redirect` a 302 to the metadata
/// address, anything else `hello`; it keeps every request head it receives and reads bodies by
/// Content-Length.
pub fn http_upstream() -> Upstream {
    let listener = listen_in_netns();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counters = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counters.accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve_http(stream, counters.clone()));
        }
    });
    Upstream { addr, seen }
}

async fn serve_http(mut stream: TcpStream, seen: Arc<Seen>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            break end + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    seen.bytes.fetch_add(buf.len(), Ordering::SeqCst);
    seen.heads.lock().unwrap().push(head.clone());
    let body_len = head
        .lines()
        .find_map(|line| line.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut have = buf.len() - head_end;
    while have < body_len {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                have += n;
                seen.bytes.fetch_add(n, Ordering::SeqCst);
            }
        }
    }
    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
    let _ = respond(&mut stream, &path, have).await;
}

async fn respond(stream: &mut TcpStream, path: &str, body_received: usize) -> std::io::Result<()> {
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        let block = vec![b'x'; 64 * 1024];
        let mut left = n;
        while left > 0 {
            let take = left.min(block.len());
            stream.write_all(&block[..take]).await?;
            left -= take;
        }
    } else if path == "/redirect" {
        stream
            .write_all(
                b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n\
                  Content-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
    } else {
        let body = format!("hello; body {body_received} bytes");
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One attempt as the recorder saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub attempt: Attempt,
    pub closes: Vec<Closed>,
}

/// A recorder that keeps everything, and can be told to fail.
#[derive(Debug, Default)]
pub struct MemoryRecorder {
    pub records: Mutex<Vec<Recorded>>,
    pub fail: AtomicBool,
    /// Summaries of denials that had no record of their own.
    pub suppressed: Mutex<Vec<Suppressed>>,
}

impl MemoryRecorder {
    pub fn records(&self) -> Vec<Recorded> {
        self.records.lock().unwrap().clone()
    }

    /// Waits until `n` attempts are recorded and each has been closed; returns them.
    pub async fn settled(&self, n: usize) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let records = self.records();
            if records.len() >= n && records.iter().all(|r| !r.closes.is_empty()) {
                assert_eq!(
                    records.len(),
                    n,
                    "more attempts recorded than made: {records:#?}"
                );
                for record in &records {
                    assert_eq!(record.closes.len(), 1, "closed more than once: {record:#?}");
                }
                return records;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("expected {n} closed attempts, have: {records:#?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl ConnectionRecorder for MemoryRecorder {
    fn open<'a>(
        &'a self,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<ConnectionId, RecordError>> {
        Box::pin(async move {
            if self.fail.load(Ordering::SeqCst) {
                return Err(RecordError("the database is down".into()));
            }
            let mut records = self.records.lock().unwrap();
            records.push(Recorded {
                attempt: attempt.clone(),
                closes: Vec::new(),
            });
            Ok(ConnectionId((records.len() - 1).to_string()))
        })
    }

    fn close<'a>(&'a self, id: ConnectionId, closed: &'a Closed) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let index: usize = id.0.parse().unwrap();
            self.records.lock().unwrap()[index]
                .closes
                .push(closed.clone());
        })
    }

    fn suppressed<'a>(&'a self, summary: &'a Suppressed) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.suppressed.lock().unwrap().push(summary.clone());
        })
    }

    /// These tests never inspect: a request record here is a bug.
    fn open_request<'a>(
        &'a self,
        request: &'a InspectedRequest,
    ) -> BoxFuture<'a, Result<RequestId, RecordError>> {
        Box::pin(async move { panic!("no tunnel is inspected here: {request:?}") })
    }

    fn close_request<'a>(&'a self, id: RequestId, _: &'a RequestDone) -> BoxFuture<'a, ()> {
        Box::pin(async move { panic!("no tunnel is inspected here: {id:?}") })
    }
}

/// The real policy bundle of this repository.
pub fn policy() -> Arc<PolicyEngine> {
    static ENGINE: OnceLock<Arc<PolicyEngine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let dir = repo_root().join("policies");
            Arc::new(
                PolicyEngine::load(&dir).unwrap_or_else(|err| {
                    panic!("loading the policy bundle {}: {err}", dir.display())
                }),
            )
        })
        .clone()
}

/// A grant of `hosts` on `ports`.
pub fn grant(hosts: &[&str], ports: &[u16]) -> NetworkGrant {
    NetworkGrant {
        allow: hosts
            .iter()
            .map(|host| HostRule::new(*host, ports.to_vec()))
            .collect(),
        max_connections: 8,
        max_bytes: 10 << 20,
        max_denied: None,
        max_denied_per_s: None,
    }
}

/// A proxy serving one execution on a Unix socket in a temporary directory.
pub struct Harness {
    pub listener: Option<ExecutionListener>,
    pub recorder: Arc<MemoryRecorder>,
    pub resolver: Arc<StaticResolver>,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

/// What a harness is built from.
pub struct Setup {
    pub grant: NetworkGrant,
    pub names: Vec<(&'static str, Vec<IpAddr>)>,
    pub tls_ports: Vec<u16>,
    pub limits: Option<ExecutionLimits>,
}

impl Setup {
    pub fn new(grant: NetworkGrant) -> Setup {
        Setup {
            grant,
            names: Vec::new(),
            tls_ports: vec![443],
            limits: None,
        }
    }

    pub fn name(mut self, name: &'static str, addresses: &[&str]) -> Setup {
        self.names
            .push((name, addresses.iter().map(|a| a.parse().unwrap()).collect()));
        self
    }

    pub fn tls_ports(mut self, ports: &[u16]) -> Setup {
        self.tls_ports = ports.to_vec();
        self
    }

    pub fn limits(mut self, edit: impl FnOnce(&mut ExecutionLimits)) -> Setup {
        let mut limits = ExecutionLimits::from_grant(&self.grant);
        edit(&mut limits);
        self.limits = Some(limits);
        self
    }

    pub fn start(self) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("egress.sock");
        let recorder = Arc::new(MemoryRecorder::default());
        let resolver = Arc::new(StaticResolver::new(self.names));
        let config = ProxyConfig {
            tls_ports: self.tls_ports,
            denied_addresses: vec![HOST_SIDE_IP.parse().unwrap()],
            ..ProxyConfig::default()
        };
        let proxy = EgressProxy::new(config, policy(), resolver.clone(), recorder.clone());
        let limits = self
            .limits
            .unwrap_or_else(|| ExecutionLimits::from_grant(&self.grant));
        let listener = proxy
            .serve_execution(
                &socket,
                ExecutionGrant {
                    execution_id: "ex_test".into(),
                    tenant: "acme".into(),
                    grant: self.grant,
                    limits,
                    inspection: None,
                },
                CancellationToken::new(),
            )
            .unwrap();
        Harness {
            listener: Some(listener),
            recorder,
            resolver,
            socket,
            _dir: dir,
        }
    }
}

impl Harness {
    pub async fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.socket).await.unwrap()
    }

    /// Sends `request` on a new connection and reads until the proxy closes it.
    pub async fn exchange(&self, request: &[u8]) -> Vec<u8> {
        let mut stream = self.connect().await;
        stream.write_all(request).await.unwrap();
        read_to_close(&mut stream).await
    }

    /// Like `exchange`, as text.
    pub async fn exchange_text(&self, request: &str) -> String {
        String::from_utf8_lossy(&self.exchange(request.as_bytes()).await).to_string()
    }
}

/// Reads until the other side closes (a reset counts as closed), within `STEP`.
pub async fn read_to_close<R: AsyncReadExt + Unpin>(stream: &mut R) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(STEP, read)
        .await
        .expect("the proxy neither answered nor closed in time");
    out
}

/// Reads exactly `n` bytes, within `STEP`.
pub async fn read_n<R: AsyncReadExt + Unpin>(stream: &mut R, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    tokio::time::timeout(STEP, stream.read_exact(&mut out))
        .await
        .expect("timed out reading")
        .expect("reading");
    out
}

/// Reads a CONNECT answer's head (up to the blank line), within `STEP`.
pub async fn read_head<R: AsyncReadExt + Unpin>(stream: &mut R) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !out.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(0) | Err(_) => break,
                Ok(_) => out.push(byte[0]),
            }
        }
    };
    tokio::time::timeout(STEP, read)
        .await
        .expect("timed out reading a head");
    String::from_utf8_lossy(&out).to_string()
}
