//! Inspected tunnels: for a destination its grant marks `inspect: true`, the
//! proxy terminates the sandbox's TLS with a leaf of the execution's own CA, re-originates TLS
//! to the checked address (verified against the system roots and `egress_ca_file`), and decides
//! every HTTP/1.1 request in between (keep-alive: each request on its own) with the egress
//! policy, given the method, path, query and header names.
//!
//! For each request, in order: the Host must name the tunnel's host; the path is normalised
//! (crate `path`: dot segments removed, unreserved escapes decoded, encoded separators refused
//! with `egress.path_invalid`); the policy decides on that path; an `Upgrade` the decision does
//! not allow explicitly (`upgrade: true`) is `egress.upgrade_not_allowed`; a credential
//! placeholder anywhere but in a granted credential's own header (the path, the query, any
//! other header) is a `credential.misdirected` denial; the request row is recorded (durably,
//! before anything is forwarded); each granted credential's header is set to its configured
//! value (replacing whatever the sandbox sent in it; no placeholder is ever swapped in place);
//! then it is forwarded with exactly the normalised path the policy saw (and the query as it
//! came). A denied request gets the reason's status with `sandgate-egress: <code>: <message>`
//! (the policy's own code when the policy denied) and the connection stays usable. Once the
//! upstream answers `101` to an allowed upgrade (naming the protocol asked for), the two sides
//! are relayed as they are: no later byte is decided, which is why the policy must allow it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use policy_engine::{Connection, EgressExecution, EgressInput};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::Inspection;
use crate::conn::{Conn, Denial, Plan};
use crate::execution::{Execution, Shared};
use crate::host::{canonical_host, Host};
use crate::path::{normalise, MAX_PATH};
use crate::reason::{denial_line, one_line, reason_phrase, ReasonCode};
use crate::relay::Ended;
use crate::seams::{ConnectionId, InspectedRequest, RequestDone, RequestId};
use crate::streams::{Counters, Metered, Prefixed};

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Request headers never forwarded: hop-by-hop, the proxy's own, identity claims.
const DROPPED: [&str; 6] = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "http2-settings",
];

impl Conn<'_> {
    /// The execution's inspection, when its grant inspects `host` on `port`.
    pub(crate) fn inspection_for(&self, host: &Host, port: u16) -> Option<Arc<Inspection>> {
        let inspection = self.execution.inspection.as_ref()?;
        let name = host.to_string();
        let inspected = self
            .execution
            .grant
            .allow
            .iter()
            .any(|rule| rule.inspect && rule.covers(&name) && rule.ports.contains(&port));
        inspected.then(|| Arc::clone(inspection))
    }

    /// Serves an inspected tunnel whose `200` and ClientHello are behind it; returns bytes up,
    /// bytes down (upstream side) and how it ended.
    pub(crate) async fn run_inspected(
        &mut self,
        plan: &Plan,
        inspection: Arc<Inspection>,
        connection: ConnectionId,
    ) -> (u64, u64, Result<(), Ended>) {
        let counters = Arc::new(Counters::default());
        let result = self
            .inspected(plan, inspection, connection, &counters)
            .await;
        let up = counters.up.load(Ordering::Relaxed);
        let down = counters.down.load(Ordering::Relaxed);
        (up, down, result)
    }

    async fn inspected(
        &mut self,
        plan: &Plan,
        inspection: Arc<Inspection>,
        connection: ConnectionId,
        counters: &Arc<Counters>,
    ) -> Result<(), Ended> {
        let upstream_tls = self.shared.config.upstream_tls.clone().ok_or_else(|| {
            Ended::new(
                ReasonCode::UpstreamTlsFailed,
                "this gateway has no upstream TLS trust, so it cannot inspect".to_owned(),
            )
        })?;
        let host = plan.host.to_string();
        let server = inspection.ca.server_config(&host).map_err(|err| {
            Ended::new(
                ReasonCode::ClientTlsFailed,
                format!("no certificate for {host}: {err}"),
            )
        })?;
        let client = Prefixed::new(std::mem::take(&mut self.buffered), self.own_client()?);
        let accept = tokio_rustls::TlsAcceptor::from(server).accept(client);
        let limit = self.execution.limits.header_read_timeout;
        let tls = match tokio::time::timeout(limit, accept).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => return Err(client_tls_failed(&err.to_string())),
            Err(_) => return Err(client_tls_failed("the handshake did not finish in time")),
        };
        info!(host = %host, "inspected tunnel established");
        let tunnel = Arc::new(Tunnel {
            shared: Arc::clone(&self.shared),
            execution: Arc::clone(&self.execution),
            inspection,
            connection,
            host: plan.host.clone(),
            port: plan.address.port(),
            address: plan.address,
            upstream_tls,
            counters: Arc::clone(counters),
            upstream: Mutex::new(None),
            pending: Mutex::new(None),
            tasks: TaskTracker::new(),
            cancel: self.cancel.child_token(),
        });
        let result = tunnel.serve(tls).await;
        tunnel.wind_down().await;
        result
    }

    /// A second handle on the sandbox's connection that the TLS server can own.
    fn own_client(&self) -> Result<UnixStream, Ended> {
        use std::os::fd::AsFd;
        let failed = |err: std::io::Error| {
            Ended::new(
                ReasonCode::ClientFailed,
                format!("duplicating the connection: {err}"),
            )
        };
        let fd = self.client.as_fd().try_clone_to_owned().map_err(failed)?;
        let std = std::os::unix::net::UnixStream::from(fd);
        std.set_nonblocking(true).map_err(failed)?;
        UnixStream::from_std(std).map_err(failed)
    }
}

fn client_tls_failed(why: &str) -> Ended {
    Ended::new(
        ReasonCode::ClientTlsFailed,
        format!(
            "the sandbox's TLS handshake with the proxy failed ({why}); a client that pins \
             certificates, or does not trust SSL_CERT_FILE, cannot use an inspected host"
        ),
    )
}

/// A request forwarded and not yet closed: closed when the next request arrives (HTTP/1.1 is
/// sequential) or the tunnel ends, with the bytes that moved in between.
struct Pending {
    id: RequestId,
    status: u16,
    started: Instant,
    up: u64,
    down: u64,
}

/// One inspected tunnel, shared by the requests it carries.
struct Tunnel {
    shared: Arc<Shared>,
    execution: Arc<Execution>,
    inspection: Arc<Inspection>,
    connection: ConnectionId,
    host: Host,
    port: u16,
    address: SocketAddr,
    upstream_tls: Arc<rustls::ClientConfig>,
    counters: Arc<Counters>,
    upstream: Mutex<Option<SendRequest<Incoming>>>,
    pending: Mutex<Option<Pending>>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl Tunnel {
    async fn serve<S>(self: &Arc<Self>, tls: S) -> Result<(), Ended>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let tunnel = Arc::clone(self);
        let service = hyper::service::service_fn(move |request| {
            let tunnel = Arc::clone(&tunnel);
            async move { Ok::<_, Infallible>(tunnel.handle(request).await) }
        });
        let serving = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.execution.limits.idle_timeout)
            .serve_connection(TokioIo::new(tls), service)
            .with_upgrades();
        tokio::select! {
            served = serving => served.map_err(|err| {
                Ended::new(ReasonCode::ClientFailed, format!("serving the inspected tunnel: {err}"))
            }),
            () = self.cancel.cancelled() => Err(Ended::new(ReasonCode::Shutdown, "the execution ended".to_owned())),
        }
    }

    /// Decides, records and forwards one request; never fails (a failure is the answer).
    async fn handle(self: Arc<Self>, mut request: Request<Incoming>) -> Response<ProxyBody> {
        self.finish_pending().await;
        let started = Instant::now();
        let mut record = self.record_of(&request);
        let admitted = match self.admit(&request, &mut record) {
            Ok(admitted) => admitted,
            Err(denial) => return self.refuse(record, denial, started).await,
        };
        record.allow = true;
        record.reason = ReasonCode::Allowed;
        record.message = format!("{} {} allowed", record.method, record.path);
        record.credentials.clone_from(&admitted.credentials);
        let id = match self.open(&record).await {
            Ok(id) => id,
            Err(denial) => return denial_response(&denial),
        };
        let upgrade = record
            .upgrade
            .clone()
            .map(|protocol| (protocol, hyper::upgrade::on(&mut request)));
        let outgoing = self.outgoing(request, &admitted);
        let (up, down) = self.snapshot();
        let forwarded = self.forward(outgoing).await;
        let forwarded = forwarded.and_then(|response| switched_as_asked(response, &upgrade));
        match forwarded {
            Ok(mut response) => {
                let status = response.status().as_u16();
                if let (101, Some((_, client))) = (status, upgrade) {
                    self.relay_upgrade(client, hyper::upgrade::on(&mut response));
                }
                self.set_pending(Pending {
                    id,
                    status,
                    started,
                    up,
                    down,
                });
                response.map(BodyExt::boxed)
            }
            Err(denial) => {
                self.close(
                    id,
                    denial.reason.status(),
                    started,
                    (up, down),
                    Some(&denial),
                )
                .await;
                denial_response(&denial)
            }
        }
    }

    /// The row for a request as the sandbox sent it (denied until admitted).
    fn record_of(&self, request: &Request<Incoming>) -> InspectedRequest {
        let path = request.uri().path().chars().take(MAX_PATH).collect();
        let upgrade = upgrade_of(request);
        let query = request
            .uri()
            .query()
            .map(|q| hex::encode(Sha256::digest(q)));
        InspectedRequest {
            execution_id: self.execution.id.clone(),
            tenant: self.execution.tenant.clone(),
            connection: self.connection.clone(),
            host: self.host.to_string(),
            port: self.port,
            method: request.method().as_str().to_owned(),
            path,
            query_sha256: query,
            header_names: header_names(request),
            credentials: Vec::new(),
            upgrade,
            allow: false,
            reason: ReasonCode::BadRequest,
            message: String::new(),
            policy_reasons: Vec::new(),
            started_at: SystemTime::now(),
        }
    }

    /// Host check, path, policy, upgrade, placeholders: what to forward, or why not.
    fn admit(
        &self,
        request: &Request<Incoming>,
        record: &mut InspectedRequest,
    ) -> Result<Admitted, Denial> {
        self.check_host(request)?;
        let path = normalise(request.uri().path())
            .map_err(|err| Denial::new(ReasonCode::PathInvalid, err.to_string()))?;
        record.path.clone_from(&path);
        let query = request.uri().query().map(str::to_owned);
        let input = EgressInput {
            execution: EgressExecution {
                id: self.execution.id.clone(),
                tenant: self.execution.tenant.clone(),
                grant: self.execution.grant.clone(),
            },
            connection: Connection {
                host: self.host.to_string(),
                port: self.port,
                scheme: "https".to_owned(),
                method: Some(record.method.clone()),
                path: Some(path.clone()),
                query: query.clone(),
                headers: Some(record.header_names.clone()),
                upgrade: record.upgrade.clone(),
            },
        };
        let decision = self.shared.policy.decide(&input);
        record.policy_reasons.clone_from(&decision.reasons);
        if !decision.allow {
            return Err(Denial::of_policy(&decision.reasons));
        }
        if let (Some(protocol), false) = (&record.upgrade, decision.upgrade) {
            return Err(Denial::new(
                ReasonCode::UpgradeNotAllowed,
                format!(
                    "{} {} on {} asks to upgrade to {}, which no request rule allows",
                    record.method,
                    path,
                    self.host,
                    one_line(protocol)
                ),
            ));
        }
        self.check_placeholders(request, &decision.credentials, record)?;
        let target = match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        Ok(Admitted {
            credentials: decision.credentials,
            target,
        })
    }

    /// A placeholder anywhere but in a granted credential's own header is misdirected.
    fn check_placeholders(
        &self,
        request: &Request<Incoming>,
        granted: &[String],
        record: &mut InspectedRequest,
    ) -> Result<(), Denial> {
        let headers = request
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()));
        let target = request.uri().to_string();
        let misdirected: Vec<String> = self
            .inspection
            .credentials
            .misdirected(target.as_bytes(), headers, granted)
            .into_iter()
            .collect();
        if misdirected.is_empty() {
            return Ok(());
        }
        record.credentials.clone_from(&misdirected);
        Err(Denial::new(
            ReasonCode::CredentialMisdirected,
            format!(
                "the request carries the placeholder of credential {} where it may not be: \
                 only in the credential's own header, on a request the policy grants it for \
                 ({} {} on {})",
                misdirected.join(", "),
                record.method,
                record.path,
                self.host
            ),
        ))
    }

    /// The Host header (and an absolute-form target) must name the tunnel's host and port.
    fn check_host(&self, request: &Request<Incoming>) -> Result<(), Denial> {
        let mismatch = |why: String| Denial::new(ReasonCode::HostMismatch, why);
        let mut claims: Vec<String> = Vec::new();
        for value in request.headers().get_all(HOST) {
            let value = value
                .to_str()
                .map_err(|_| mismatch("the Host header is not ASCII".to_owned()))?;
            claims.push(value.to_owned());
        }
        if claims.len() != 1 {
            return Err(mismatch(format!(
                "the request has {} Host headers",
                claims.len()
            )));
        }
        if let Some(authority) = request.uri().authority() {
            claims.push(authority.as_str().to_owned());
        }
        for claim in claims {
            let (name, port) = match claim.rsplit_once(':') {
                Some((name, port)) => (name, port.parse::<u16>().ok()),
                None => (claim.as_str(), Some(self.port)),
            };
            let same =
                canonical_host(name).is_ok_and(|host| host == self.host) && port == Some(self.port);
            if !same {
                return Err(mismatch(format!(
                    "the request names host {}, but the tunnel is to {}",
                    one_line(&claim),
                    self.host
                )));
            }
        }
        Ok(())
    }

    /// The request as forwarded: the admitted (normalised) target in origin form, hop-by-hop
    /// headers dropped, each granted credential's header set to its configured value.
    fn outgoing(&self, request: Request<Incoming>, admitted: &Admitted) -> Request<Incoming> {
        let (mut parts, body) = request.into_parts();
        let credentials = &self.inspection.credentials;
        let upgrade = parts.headers.get(hyper::header::UPGRADE).cloned();
        let mut headers = hyper::HeaderMap::new();
        for (name, value) in parts.headers.iter() {
            let lower = name.as_str();
            if DROPPED.contains(&lower)
                || lower.starts_with("proxy-")
                || lower.starts_with("x-sandgate-")
            {
                continue;
            }
            headers.append(name.clone(), value.clone());
        }
        if let Some(upgrade) = upgrade {
            headers.insert(
                hyper::header::CONNECTION,
                HeaderValue::from_static("upgrade"),
            );
            headers.insert(hyper::header::UPGRADE, upgrade);
        }
        for name in &admitted.credentials {
            let Some(credential) = credentials.get(name) else {
                continue;
            };
            let header = HeaderName::from_bytes(credential.header.as_bytes());
            let value = HeaderValue::from_str(&credential.header_value());
            if let (Ok(header), Ok(mut value)) = (header, value) {
                value.set_sensitive(true);
                headers.insert(header, value);
            }
        }
        // The normalised target is made of the original's characters (or fewer escapes), so
        // it parses; should it not, the request goes nowhere rather than somewhere else.
        parts.uri = admitted
            .target
            .parse()
            .unwrap_or_else(|_| hyper::Uri::from_static("/sandgate-unparsable-target"));
        parts.headers = headers;
        Request::from_parts(parts, body)
    }

    /// Sends the request on the tunnel's upstream connection (dialled and verified on first use).
    async fn forward(&self, request: Request<Incoming>) -> Result<Response<Incoming>, Denial> {
        let existing = self
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let mut sender = match existing {
            Some(sender) if !sender.is_closed() => sender,
            _ => self.connect().await?,
        };
        let upstream_failed = |err: hyper::Error| {
            Denial::new(ReasonCode::UpstreamFailed, format!("{}: {err}", self.host))
        };
        sender.ready().await.map_err(upstream_failed)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(upstream_failed)?;
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender);
        Ok(response)
    }

    /// Dials exactly the checked address and starts verified TLS with the host's name.
    async fn connect(&self) -> Result<SendRequest<Incoming>, Denial> {
        let limit = self.execution.limits.connect_timeout;
        let tcp = match tokio::time::timeout(limit, TcpStream::connect(self.address)).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(err)) => {
                return Err(Denial::new(
                    ReasonCode::UpstreamFailed,
                    format!("connecting to {} failed: {err}", self.address),
                ))
            }
            Err(_) => {
                return Err(Denial::new(
                    ReasonCode::UpstreamTimeout,
                    "connect timed out",
                ))
            }
        };
        let _ = tcp.set_nodelay(true);
        let metered = Metered {
            inner: tcp,
            execution: Arc::clone(&self.execution),
            counters: Arc::clone(&self.counters),
        };
        let tls_failed = |why: String| {
            Denial::new(
                ReasonCode::UpstreamTlsFailed,
                format!("TLS to {} failed: {why}", self.host),
            )
        };
        let name = rustls_pki_types::ServerName::try_from(self.host.to_string())
            .map_err(|err| tls_failed(err.to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.upstream_tls));
        let tls = match tokio::time::timeout(limit, connector.connect(name, metered)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => return Err(tls_failed(err.to_string())),
            Err(_) => return Err(tls_failed("the handshake timed out".to_owned())),
        };
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|err| tls_failed(err.to_string()))?;
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = connection.with_upgrades() => {}
                () = cancel.cancelled() => {}
            }
        });
        Ok(sender)
    }

    /// After a `101`, relays the two upgraded connections as they are.
    fn relay_upgrade(
        &self,
        client: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::OnUpgrade,
    ) {
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            let (Ok(client), Ok(upstream)) = (client.await, upstream.await) else {
                return;
            };
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                () = cancel.cancelled() => {}
            }
        });
    }

    /// Records a refused request and answers it; the connection stays open.
    async fn refuse(
        &self,
        mut record: InspectedRequest,
        denial: Denial,
        started: Instant,
    ) -> Response<ProxyBody> {
        record.allow = false;
        record.reason = denial.reason;
        record.message = one_line(&denial.message);
        warn!(reason = denial.reason.code(), message = %record.message, "inspected request denied");
        match self.open(&record).await {
            Ok(id) => {
                let snapshot = self.snapshot();
                self.close(id, denial.reason.status(), started, snapshot, None)
                    .await;
                denial_response(&denial)
            }
            Err(unavailable) => denial_response(&unavailable),
        }
    }

    async fn open(&self, record: &InspectedRequest) -> Result<RequestId, Denial> {
        let timeout = self.shared.config.record_timeout;
        match tokio::time::timeout(timeout, self.shared.recorder.open_request(record)).await {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(err)) => {
                warn!(error = %err, "inspected request could not be recorded; refused");
                Err(audit_unavailable())
            }
            Err(_) => Err(audit_unavailable()),
        }
    }

    async fn close(
        &self,
        id: RequestId,
        status: u16,
        started: Instant,
        (up, down): (u64, u64),
        denial: Option<&Denial>,
    ) {
        let (now_up, now_down) = self.snapshot();
        let done = RequestDone {
            status,
            bytes_up: now_up.saturating_sub(up),
            bytes_down: now_down.saturating_sub(down),
            duration: started.elapsed(),
            error: denial.map(|d| one_line(&d.message)),
        };
        let timeout = self.shared.config.record_timeout;
        let close = self.shared.recorder.close_request(id, &done);
        if tokio::time::timeout(timeout, close).await.is_err() {
            warn!("recording an inspected request's end timed out");
        }
    }

    /// After the HTTP connection ended (or was upgraded): drops the upstream connection, lets an
    /// upgraded relay run to its end (or the execution's), then closes the last request's row.
    async fn wind_down(&self) {
        drop(
            self.upstream
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        self.tasks.close();
        tokio::select! {
            () = self.tasks.wait() => {}
            () = self.cancel.cancelled() => {}
        }
        self.cancel.cancel();
        self.tasks.wait().await;
        self.finish_pending().await;
    }

    fn set_pending(&self, pending: Pending) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(pending);
    }

    async fn finish_pending(&self) {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(p) = pending {
            self.close(p.id, p.status, p.started, (p.up, p.down), None)
                .await;
        }
    }

    fn snapshot(&self) -> (u64, u64) {
        (
            self.counters.up.load(Ordering::Relaxed),
            self.counters.down.load(Ordering::Relaxed),
        )
    }
}

fn audit_unavailable() -> Denial {
    Denial::new(
        ReasonCode::AuditUnavailable,
        "the audit log is unavailable, so no request can be forwarded",
    )
}

/// The proxy's own answer inside a tunnel: the reason's status, `sandgate-egress: <code>:
/// <message>` as its reason phrase and its body (the same shape as a refused CONNECT's).
fn denial_response(denial: &Denial) -> Response<ProxyBody> {
    let code = denial.shown_code();
    let body = format!("{}\n", denial_line(&code, &denial.message));
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() =
        hyper::StatusCode::from_u16(denial.reason.status()).unwrap_or(hyper::StatusCode::FORBIDDEN);
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(code) = HeaderValue::from_str(&code) {
        headers.insert("x-sandgate-reason", code);
    }
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason_phrase(&code, &denial.message)) {
        response.extensions_mut().insert(phrase);
    }
    response
}

fn header_names(request: &Request<Incoming>) -> Vec<String> {
    let mut names: Vec<String> = request
        .headers()
        .keys()
        .map(|n| n.as_str().to_owned())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// What an admitted request is forwarded with.
struct Admitted {
    /// Credentials whose header is set.
    credentials: Vec<String>,
    /// The normalised path the policy decided on, and the query as it came.
    target: String,
}

/// The protocol the request's `Upgrade` headers ask for, lower case (several joined with `, `,
/// a value that is not text as `?`); `None` without one.
fn upgrade_of<B>(request: &Request<B>) -> Option<String> {
    let values: Vec<String> = request
        .headers()
        .get_all(hyper::header::UPGRADE)
        .iter()
        .map(|value| {
            value
                .to_str()
                .map_or("?".to_owned(), |v| v.trim().to_ascii_lowercase())
        })
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// A `101` must switch to the protocol the policy allowed; anything else is not relayed.
fn switched_as_asked(
    response: Response<Incoming>,
    upgrade: &Option<(String, hyper::upgrade::OnUpgrade)>,
) -> Result<Response<Incoming>, Denial> {
    if response.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        return Ok(response);
    }
    let switched = upgrade_of_response(&response);
    match upgrade {
        Some((asked, _)) if switched.as_deref() == Some(asked.as_str()) => Ok(response),
        Some((asked, _)) => Err(Denial::new(
            ReasonCode::UpstreamFailed,
            format!(
                "the upstream switched to {}, not the {} the request asked for",
                one_line(switched.as_deref().unwrap_or("nothing")),
                one_line(asked)
            ),
        )),
        None => Err(Denial::new(
            ReasonCode::UpstreamFailed,
            "the upstream switched protocols on a request that asked for no upgrade",
        )),
    }
}

fn upgrade_of_response(response: &Response<Incoming>) -> Option<String> {
    let value = response.headers().get(hyper::header::UPGRADE)?;
    value.to_str().ok().map(|v| v.trim().to_ascii_lowercase())
}
