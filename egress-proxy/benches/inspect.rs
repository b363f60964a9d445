//! Measures (does not assert) what inspection costs (issue 12 item 8), against the same HTTPS
//! upstream in the `sgtest` network namespace, in one run:
//! - per request on one keep-alive HTTPS connection: direct (TLS straight to the upstream),
//!   through a plain tunnel (CONNECT, SNI checked, bytes relayed) and through an inspected tunnel
//!   (TLS terminated with the execution's CA, each request decided by the shipped Rego policy,
//!   recorded, and re-originated over TLS): p50 and p99 latency, requests/s, and the latency
//!   each tunnel adds to direct;
//! - the handshake of an inspected tunnel whose leaf certificate is minted for it (the
//!   execution's first connection to the host) against one whose leaf is cached.
//!
//! The recorder keeps nothing (the audit cost is measured by the gateway's benches); the policy
//! is the repository's `policies/` with one tenant added that may GET anything on the upstream.
//! `cargo bench -p egress-proxy --bench inspect` (root: it brings up the namespace). Counts can
//! be changed with SANDGATE_BENCH_REQUESTS and SANDGATE_BENCH_HANDSHAKES.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is a failure report

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use egress_proxy::{
    Attempt, Closed, ConnectionId, ConnectionRecorder, EgressProxy, ExecutionGrant,
    ExecutionLimits, ExecutionListener, InspectedRequest, Inspection, ProxyConfig, RecordError,
    RequestDone, RequestId, StaticResolver, Suppressed,
};
use futures_util::future::BoxFuture;
use policy_engine::{HostRule, NetworkGrant, PolicyEngine};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;

const HOST: &str = "upstream.test";
const TENANT: &str = "benchtenant";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA and a leaf for [`HOST`] it signed: the upstream's TLS, and the CA's certificate
/// (DER and PEM).
fn upstream_tls() -> (Arc<rustls::ServerConfig>, CertificateDer<'static>, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![HOST.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivatePkcs8KeyDer::from(leaf_key.serialize_der()).into(),
        )
        .unwrap();
    (Arc::new(config), ca.der().clone(), ca.pem())
}

/// A keep-alive HTTPS server in the namespace answering every request `200` with `ok`.
fn start_upstream(tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = support::listen_in_netns();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(stream).await else {
                    return;
                };
                while read_head(&mut stream).await.is_some() {
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads one message head (up to its blank line); `None` at the end of the stream.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(head)
}

/// One GET on a keep-alive connection, its `ok` answer read whole.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let request = format!("GET /x HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(stream).await.expect("a response");
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut body = [0u8; 2];
    stream.read_exact(&mut body).await.unwrap();
}

/// Records nothing; hands out ids.
#[derive(Default)]
struct Discard(AtomicU64);

impl Discard {
    fn next(&self) -> String {
        self.0.fetch_add(1, Ordering::Relaxed).to_string()
    }
}

impl ConnectionRecorder for Discard {
    fn open<'a>(&'a self, _: &'a Attempt) -> BoxFuture<'a, Result<ConnectionId, RecordError>> {
        Box::pin(async move { Ok(ConnectionId(self.next())) })
    }
    fn close<'a>(&'a self, _: ConnectionId, _: &'a Closed) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    fn suppressed<'a>(&'a self, _: &'a Suppressed) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    fn open_request<'a>(
        &'a self,
        _: &'a InspectedRequest,
    ) -> BoxFuture<'a, Result<RequestId, RecordError>> {
        Box::pin(async move { Ok(RequestId(self.next())) })
    }
    fn close_request<'a>(&'a self, _: RequestId, _: &'a RequestDone) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The repository's policy bundle plus [`TENANT`], which may GET anything on [`HOST`].
fn policy_with_tenant(dir: &Path, port: u16) -> Arc<PolicyEngine> {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    for name in ["egress.rego", "execution.rego"] {
        std::fs::copy(shipped.join(name), dir.join(name)).unwrap();
    }
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let mut tenants = std::fs::read_to_string(shipped.join("data/tenants.yaml")).unwrap();
    tenants.push_str(&format!(
        "  {TENANT}:\n    network:\n      allow:\n        - host: {HOST}\n          ports: [{port}]\n          inspect: true\n          requests:\n            - {{methods: [GET], paths: [/]}}\n"
    ));
    std::fs::write(dir.join("data/tenants.yaml"), tenants).unwrap();
    Arc::new(PolicyEngine::load(dir).unwrap())
}

struct Bench {
    proxy: EgressProxy,
    grant: NetworkGrant,
    dir: tempfile::TempDir,
    upstream: SocketAddr,
    upstream_ca: CertificateDer<'static>,
    served: u64,
}

impl Bench {
    /// A listener for a new execution (inspected or not) and, when inspected, its CA.
    fn execution(
        &mut self,
        inspect: bool,
    ) -> (
        ExecutionListener,
        std::path::PathBuf,
        Option<CertificateDer<'static>>,
    ) {
        self.served += 1;
        let id = format!("ex_bench{}", self.served);
        let mut grant = self.grant.clone();
        grant.allow[0].inspect = inspect;
        let inspection = Inspection::for_grant(&id, &grant, self.proxy.config())
            .unwrap()
            .map(Arc::new);
        let ca = inspection
            .as_ref()
            .map(|i| CertificateDer::from_pem_slice(i.ca.certificate_pem().as_bytes()).unwrap());
        let socket = self.dir.path().join(format!("{id}.sock"));
        let listener = self
            .proxy
            .serve_execution(
                &socket,
                ExecutionGrant {
                    execution_id: id,
                    tenant: TENANT.into(),
                    limits: ExecutionLimits::from_grant(&grant),
                    grant,
                    inspection,
                },
                CancellationToken::new(),
            )
            .unwrap();
        (listener, socket, ca)
    }
}

fn client_tls(root: &CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// CONNECT through the execution's socket, then TLS to [`HOST`] trusting `root`.
async fn through_proxy(
    socket: &Path,
    port: u16,
    root: &CertificateDer<'static>,
) -> tokio_rustls::client::TlsStream<UnixStream> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let connect = format!("CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n");
    stream.write_all(connect.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await.unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let name = ServerName::try_from(HOST).unwrap();
    client_tls(root).connect(name, stream).await.unwrap()
}

async fn direct(
    upstream: SocketAddr,
    root: &CertificateDer<'static>,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let stream = TcpStream::connect(upstream).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let name = ServerName::try_from(HOST).unwrap();
    client_tls(root).connect(name, stream).await.unwrap()
}

/// Latencies (µs) of `n` sequential GETs on one connection, and the requests per second.
async fn requests<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, n: usize) -> (Vec<f64>, f64) {
    for _ in 0..n / 10 {
        get(stream).await; // warm-up
    }
    let start = Instant::now();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        get(stream).await;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    samples.sort_by(f64::total_cmp);
    (samples, rate)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(name: &str, (samples, rate): &(Vec<f64>, f64), direct_p50: f64) {
    let p50 = pct(samples, 0.5);
    println!(
        "  {name:<10} p50 {p50:8.1} µs  p99 {:8.1} µs  {rate:8.0} req/s  added p50 {:+8.1} µs",
        pct(samples, 0.99),
        p50 - direct_p50
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = env_usize("SANDGATE_BENCH_REQUESTS", 2000);
    let handshakes = env_usize("SANDGATE_BENCH_HANDSHAKES", 30);
    let (tls, upstream_ca, upstream_ca_pem) = upstream_tls();
    let upstream = start_upstream(tls);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("upstream-ca.pem"), upstream_ca_pem).unwrap();
    let policy_dir = tempfile::tempdir().unwrap();
    let policy = policy_with_tenant(policy_dir.path(), upstream.port());
    let config = ProxyConfig {
        tls_ports: vec![upstream.port()],
        upstream_tls: Some(
            egress_proxy::upstream_tls(Some(&dir.path().join("upstream-ca.pem"))).unwrap(),
        ),
        ..ProxyConfig::default()
    };
    let resolver = Arc::new(StaticResolver::new(vec![(HOST, vec![upstream.ip()])]));
    let proxy = EgressProxy::new(config, policy, resolver, Arc::new(Discard::default()));
    let grant = NetworkGrant {
        allow: vec![HostRule::new(HOST, vec![upstream.port()])],
        max_connections: 64,
        max_bytes: u64::MAX / 2,
        max_denied: None,
        max_denied_per_s: None,
    };
    let mut bench = Bench {
        proxy,
        grant,
        dir,
        upstream,
        upstream_ca,
        served: 0,
    };

    println!("egress inspection: {n} sequential GETs on one keep-alive HTTPS connection each");
    let direct_run = requests(&mut direct(bench.upstream, &bench.upstream_ca).await, n).await;
    let (_plain, plain_socket, _) = bench.execution(false);
    let ca = bench.upstream_ca.clone();
    let tunnel_run = requests(
        &mut through_proxy(&plain_socket, upstream.port(), &ca).await,
        n,
    )
    .await;
    let (_inspected, inspected_socket, execution_ca) = bench.execution(true);
    let execution_ca = execution_ca.unwrap();
    let inspected_run = requests(
        &mut through_proxy(&inspected_socket, upstream.port(), &execution_ca).await,
        n,
    )
    .await;
    let direct_p50 = pct(&direct_run.0, 0.5);
    report("direct", &direct_run, direct_p50);
    report("tunnel", &tunnel_run, direct_p50);
    report("inspected", &inspected_run, direct_p50);

    // Handshakes: the first connection of an execution mints the leaf, the second reuses it.
    let (mut first, mut cached) = (Vec::new(), Vec::new());
    for _ in 0..handshakes {
        let (_listener, socket, ca) = bench.execution(true);
        let ca = ca.unwrap();
        for samples in [&mut first, &mut cached] {
            let t = Instant::now();
            let mut stream = through_proxy(&socket, upstream.port(), &ca).await;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            get(&mut stream).await;
        }
    }
    first.sort_by(f64::total_cmp);
    cached.sort_by(f64::total_cmp);
    println!("inspected tunnel set-up (CONNECT + TLS handshake), {handshakes} executions:");
    println!(
        "  leaf minted  p50 {:8.1} µs  p99 {:8.1} µs",
        pct(&first, 0.5),
        pct(&first, 0.99)
    );
    println!(
        "  leaf cached  p50 {:8.1} µs  p99 {:8.1} µs  (minting costs {:+.1} µs at p50)",
        pct(&cached, 0.5),
        pct(&cached, 0.99),
        pct(&first, 0.5) - pct(&cached, 0.5)
    );
}
