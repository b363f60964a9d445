//! The three seams the gateway plugs into the proxy: the egress policy, the resolver and the
//! audit recorder, and the records the recorder receives.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use policy_engine::{EgressDecision, EgressInput, PolicyEngine, Reason};

use crate::reason::ReasonCode;

/// Decides one connection attempt on its canonical host and port, before anything is resolved.
/// The gateway implements it with the Rego rule `sandgate.egress.decision` of its current
/// bundle. It must not fail: an engine error is a deny (`policy.error`). It is called on the
/// connection's task, so it must be quick (the policy engine bounds an evaluation at 50 ms).
pub trait EgressPolicy: Send + Sync + 'static {
    fn decide(&self, input: &EgressInput) -> EgressDecision;
}

impl EgressPolicy for PolicyEngine {
    fn decide(&self, input: &EgressInput) -> EgressDecision {
        self.decide_egress(input)
    }
}

/// Why a name did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("no address for {0}")]
    NotFound(String),
    #[error("resolving {name} failed: {message}")]
    Failed { name: String, message: String },
}

/// Resolves a canonical host name (never an IP literal: those are not resolved) to addresses.
/// Called once per allowed attempt; the proxy bounds it with its DNS timeout.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, ResolveError>>;
}

/// The id the recorder gave an attempt (e.g. the `egress_connections` row id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub String);

/// The recorder could not make the attempt durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("recording the connection failed: {0}")]
pub struct RecordError(pub String);

/// How the sandbox asked to reach the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `CONNECT` to one of the TLS ports: the tunnel is checked to carry TLS with a matching SNI.
    Https,
    /// `CONNECT` to any other port: an opaque TCP tunnel.
    Connect,
    /// An absolute-form plain HTTP request.
    Http,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Https => "https",
            Scheme::Connect => "connect",
            Scheme::Http => "http",
        }
    }
}

/// One connection attempt, allowed or denied, as the proxy saw it when it decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub execution_id: String,
    pub tenant: String,
    /// Canonical host; for a host that could not be canonicalised, an escaped and truncated
    /// copy of what was sent; empty when the request never named one (malformed head).
    pub host: String,
    /// 0 when the request never named one.
    pub port: u16,
    /// `None` when the request never got as far as a form the proxy serves.
    pub scheme: Option<Scheme>,
    /// The ClientHello's server name (TLS ports only, once read).
    pub sni: Option<String>,
    /// Plain HTTP only.
    pub method: Option<String>,
    /// Plain HTTP only: the path, without the query string (which may carry secrets).
    pub path: Option<String>,
    /// The address that will be dialled (allowed), or the one that was refused.
    pub address: Option<SocketAddr>,
    pub allow: bool,
    pub reason: ReasonCode,
    /// One line for a person or a model: why it was denied, or what was allowed.
    pub message: String,
    /// The egress policy's reasons as it returned them, when it was asked.
    pub policy_reasons: Vec<Reason>,
    pub started_at: SystemTime,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    /// Bytes sent to the upstream (forwarded request heads and ClientHellos included).
    pub bytes_up: u64,
    /// Bytes sent from the upstream to the sandbox.
    pub bytes_down: u64,
    pub duration: Duration,
    pub reason: ReasonCode,
    /// What failed, when something did (an I/O error's text: no request data).
    pub error: Option<String>,
}

/// Denied attempts of one execution that were refused without a record of their own (past its
/// denial bounds), counted over one window.
#[derive(Debug, Clone, PartialEq)]
pub struct Suppressed {
    pub execution_id: String,
    pub tenant: String,
    /// Attempts refused in the window.
    pub count: u64,
    /// The same, by the reason each would have been denied for.
    pub by_reason: Vec<(String, u64)>,
    pub from: SystemTime,
    pub until: SystemTime,
}

/// The id the recorder gave one inspected request (e.g. the `egress_requests` row id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(pub String);

/// One HTTP request inside an inspected tunnel, allowed or denied, as the proxy decided it. It
/// never holds a credential's value: only names, and the sandbox's own path and header names.
#[derive(Debug, Clone, PartialEq)]
pub struct InspectedRequest {
    pub execution_id: String,
    pub tenant: String,
    /// The tunnel's connection row.
    pub connection: ConnectionId,
    pub host: String,
    pub port: u16,
    pub method: String,
    /// Without the query: the normalised path the policy decided on and the upstream was sent
    /// (crate `path`); for a path refused as unnormalisable (`egress.path_invalid`), the path
    /// as the sandbox sent it, cut to [`crate::MAX_PATH`] bytes.
    pub path: String,
    /// SHA-256 (hex) of the query string, when there is one (the query may carry secrets).
    pub query_sha256: Option<String>,
    /// Lower case, sorted, each once.
    pub header_names: Vec<String>,
    /// Credentials attached (allowed) or misdirected (a `credential.misdirected` denial).
    pub credentials: Vec<String>,
    /// The protocol a WebSocket (or other) `Upgrade` request asked for, lower case; `None`
    /// without an `Upgrade` header. The request's status (`101`) says whether it happened.
    pub upgrade: Option<String>,
    pub allow: bool,
    pub reason: ReasonCode,
    pub message: String,
    pub policy_reasons: Vec<Reason>,
    pub started_at: SystemTime,
}

/// How an inspected request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestDone {
    /// The upstream's status, or the proxy's own answer's.
    pub status: u16,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
    /// What failed, when something did (no request data, no credential).
    pub error: Option<String>,
}

/// Audits every attempt. The gateway implements it with Postgres (`egress_connections` plus an
/// `audit_events` row).
///
/// - `open` is called once for **every** attempt, allowed or denied, and must return only once
///   the row is durable: the proxy dials nothing and sends no byte upstream before it returns
///   `Ok`. If it fails (or exceeds the proxy's record timeout) the attempt is refused with 503
///   `egress.audit_unavailable`.
/// - `close` is called exactly once for each id `open` returned: at once for denials, when the
///   connection ends for allowed ones. It cannot fail from the proxy's point of view; retrying
///   and reconciling rows a crash left open is the recorder's job. The proxy stops waiting for
///   it after the record timeout too.
/// - When `open` returns after the record timeout, the proxy has already refused the attempt and
///   will not `close` it: a row written that late stays open for the recorder's reconciliation.
///
/// When `open` is called in an attempt's life:
/// - denied before dialling (malformed, limits, policy, DNS, address, SNI): `open` with
///   `allow: false` and the reason, then `close` with zero bytes, then the answer;
/// - `CONNECT` to a TLS port: after the policy, DNS and address checks, the proxy answers `200`,
///   reads the ClientHello and checks its SNI, and only then calls `open` (so the row carries the
///   SNI) with `allow: true`, then dials; a refused SNI is a denial as above;
/// - `CONNECT` to another port and plain HTTP: `open` with `allow: true` after the address
///   check, then the dial; a failed dial is an allowed attempt whose `close` says
///   `egress.upstream_failed` / `egress.upstream_timeout`.
pub trait ConnectionRecorder: Send + Sync + 'static {
    fn open<'a>(&'a self, attempt: &'a Attempt)
        -> BoxFuture<'a, Result<ConnectionId, RecordError>>;
    fn close<'a>(&'a self, id: ConnectionId, closed: &'a Closed) -> BoxFuture<'a, ()>;
    /// Records one summary of denials that had no record of their own: one per execution per
    /// window in which there were any, and a last one when its listener closes.
    fn suppressed<'a>(&'a self, summary: &'a Suppressed) -> BoxFuture<'a, ()>;
    /// Records one request inside an inspected tunnel, durably, before anything of it is
    /// forwarded (a failure refuses the request with 503); called for denied requests too.
    fn open_request<'a>(
        &'a self,
        request: &'a InspectedRequest,
    ) -> BoxFuture<'a, Result<RequestId, RecordError>>;
    /// Called once per id `open_request` returned, when the request (and its response) ended.
    fn close_request<'a>(&'a self, id: RequestId, done: &'a RequestDone) -> BoxFuture<'a, ()>;
}
