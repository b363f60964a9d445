//! The documents exchanged with the policy, for both entry points: the input sandgate sends and the
//! decision it obeys (execution: [`PolicyInput`] -> [`Decision`]; egress: [`EgressInput`] ->
//! [`EgressDecision`]).
//!
//! Field names and shapes are the contract `policies/README.md` ("The two questions") documents;
//! `policies/` is written against them. Decision types reject unknown fields, so a typo in a
//! policy (`limit` for `limits`) is a `policy.error` deny rather than a silently ignored grant.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Shared with the HTTP API, whose wire types they are.
pub use api_types::{E2bCall, E2bInput, HostPort, Limits, Reason, RequestedLimits};

/// Everything the policy may look at for one execution request (`input` in Rego).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyInput {
    pub principal: Principal,
    pub request: RequestInput,
    pub environment: Environment,
}

/// The authenticated API key that sent the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Principal {
    pub key_id: String,
    pub tenant: String,
    pub role: String,
}

/// What the request asks for. Code and file contents are never sent to the policy, only their sizes
/// and the code's hash.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestInput {
    pub language: String,
    pub code_sha256: String,
    pub code_bytes: u64,
    pub files: Vec<FileInput>,
    pub network: Vec<HostPort>,
    /// As sent by the client, e.g. `dataset:census`.
    pub mounts: Vec<String>,
    pub limits: RequestedLimits,
    pub labels: BTreeMap<String, String>,
    /// What is asked for: a plain execution, a session, or an execution in a session.
    #[serde(default)]
    pub kind: RequestKind,
    /// With `kind: session_execution`, the session it runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionInput>,
    /// With `kind: session`: the snapshot the new session is restored from (a fork).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<SnapshotInput>,
    /// Requests through the E2B-compatible API (`/e2b`): the template, `allow_internet_access`
    /// and the SDK call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2b: Option<E2bInput>,
}

/// `request.from_snapshot`: the snapshot a session is restored from, and the session it was
/// taken of (DESIGN 15).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInput {
    pub id: String,
    pub session_id: String,
    /// RFC 3339.
    pub created_at: String,
}

/// `request.kind`: lets a policy treat sessions apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    #[default]
    Execution,
    Session,
    SessionExecution,
}

/// The session an execution runs in (`request.session`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInput {
    pub id: String,
    /// Executions the session ran before this one.
    pub executions: u64,
    /// RFC 3339.
    pub created_at: String,
    /// The key that opened the session. Only it may use the session, unless the decision for
    /// another key allows and carries the reason code [`SESSION_SHARED_CODE`].
    #[serde(default)]
    pub owner: SessionParty,
    /// The key asking (the same key as `principal.key_id`), with its principal.
    #[serde(default)]
    pub asked_by: SessionParty,
}

/// A key and the principal behind it (`request.session.owner`, `request.session.asked_by`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionParty {
    pub key_id: String,
    /// Normalised, as stored with the key (`sandgate keys create --principal`).
    pub principal: String,
}

/// The reason code by which a decision shares a session with a key that did not open it: the
/// gateway lets such a key see and use the session only when the policy's decision for it
/// allows and carries this code (`policies/README.md`, "Sharing sessions").
pub const SESSION_SHARED_CODE: &str = "session.shared";

/// One input file of the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FileInput {
    pub path: String,
    pub bytes: u64,
}

/// Facts about this gateway that the policy may need.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// Isolation backends this gateway can start (names from its config, e.g. `gvisor`).
    pub backends: Vec<String>,
    /// Datasets this gateway can mount (names from its config).
    pub datasets: Vec<String>,
    /// Decision time, RFC 3339.
    pub now: String,
}

/// The policy's answer, deserialized strictly.
///
/// `allow: false` always denies. `allow: true` must name a `backend` and `limits`, otherwise the
/// engine turns the decision into a `policy.error` deny (see [`crate::PolicyEngine::decide`]).
/// `allow: true` with `require_approval: true` means the rest of the decision is what will run once a
/// reviewer approves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub allow: bool,
    #[serde(default)]
    pub require_approval: bool,
    #[serde(default)]
    pub reasons: Vec<Reason>,
    #[serde(default)]
    pub backend: Option<String>,
    /// `None`: the sandbox gets no egress at all.
    #[serde(default)]
    pub network: Option<NetworkGrant>,
    #[serde(default)]
    pub mounts: Vec<MountGrant>,
    #[serde(default)]
    pub limits: Option<Limits>,
}

/// Reason code used for every deny the engine itself produces (load, evaluation or shape errors).
pub const POLICY_ERROR_CODE: &str = "policy.error";

impl Decision {
    /// A deny carrying a single `policy.error` reason: what every engine failure turns into.
    pub fn deny_with_error(message: impl Into<String>) -> Decision {
        Decision {
            allow: false,
            require_approval: false,
            reasons: vec![Reason {
                code: POLICY_ERROR_CODE.to_string(),
                message: message.into(),
            }],
            backend: None,
            network: None,
            mounts: Vec::new(),
            limits: None,
        }
    }
}

/// The egress the sandbox may use through sandgate's proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkGrant {
    pub allow: Vec<HostRule>,
    pub max_connections: u32,
    pub max_bytes: u64,
    /// Denied attempts recorded one by one for the execution; past it they are refused and
    /// counted into summaries (absent: the proxy's default, 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_denied: Option<u32>,
    /// The same per second (absent: the proxy's default, 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_denied_per_s: Option<u32>,
}

/// One allowed host (exact, or `*.example.com` for subdomains) and its ports. The engine refuses a
/// decision whose patterns or ports are invalid (see [`crate::validate_host_pattern`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRule {
    pub host: String,
    pub ports: Vec<u16>,
    /// The proxy terminates TLS to this host (with the execution's own CA) and decides every
    /// HTTP request inside the tunnel. Absent: an opaque tunnel, SNI checked.
    #[serde(default, skip_serializing_if = "is_false")]
    pub inspect: bool,
    /// Credentials (names from the gateway's `credentials` config) that requests to this host may
    /// have attached; only together with `inspect`. The sandbox gets a placeholder for each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
}

impl HostRule {
    /// A plain rule: the host on these ports, no inspection, no credentials.
    pub fn new(host: impl Into<String>, ports: Vec<u16>) -> HostRule {
        HostRule {
            host: host.into(),
            ports,
            inspect: false,
            credentials: Vec::new(),
        }
    }

    /// Whether this rule's pattern covers the canonical `host`: the name itself, or for `*.name`
    /// any name below it, on a label boundary (the same rule `policies/egress.rego` applies).
    pub fn covers(&self, host: &str) -> bool {
        match self.host.strip_prefix('*') {
            Some(suffix) => {
                suffix.starts_with('.') && host.ends_with(suffix) && !host.starts_with('.')
            }
            None => self.host == host,
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// One dataset mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountGrant {
    pub dataset: String,
    pub target: String,
    pub read_only: bool,
}

/// Everything the egress policy may look at for one connection attempt through the proxy (`input`
/// of `data.sandgate.egress.decision`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EgressInput {
    pub execution: EgressExecution,
    pub connection: Connection,
}

/// The execution a connection belongs to, known from the socket it arrived on (never from anything
/// the sandbox sends).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EgressExecution {
    pub id: String,
    pub tenant: String,
    /// The network grant of the execution's decision, as it was approved.
    pub grant: NetworkGrant,
}

/// One connection attempt, as the proxy read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Connection {
    /// Canonical host name: lower case, no trailing dot, IDNA (punycode) form, IPv4 literals in
    /// dotted-quad form. The policy compares it as a string; canonicalising is the proxy's job.
    pub host: String,
    pub port: u16,
    /// How the sandbox asks to reach the host: `https` (`CONNECT` to a TLS port, SNI checked),
    /// `connect` (`CONNECT` to any other port) or `http` (absolute-form plain HTTP request).
    pub scheme: String,
    /// Plain HTTP only: the request method; absent (not `null`) for tunnels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Plain HTTP and requests inside an inspected tunnel: the request path, without the query;
    /// absent (not `null`) for tunnels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Requests inside an inspected tunnel only: the query string (without `?`), absent when
    /// the request has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Requests inside an inspected tunnel only: the request's header names, lower case, sorted,
    /// each once (values are never sent: they may hold secrets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<String>>,
    /// Requests inside an inspected tunnel only: the protocol the request's `Upgrade` header
    /// asks for, lower case (`websocket`; several headers joined with `, `); absent without one.
    /// An upgrade goes ahead only when the decision says `upgrade: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<String>,
}

/// The egress policy's answer for one connection, deserialized strictly. `allow: false` closes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressDecision {
    pub allow: bool,
    #[serde(default)]
    pub reasons: Vec<Reason>,
    /// Requests inside an inspected tunnel only: names of the credentials the proxy attaches to
    /// this request. Each must be listed by the grant's rule for the host, or the decision is a
    /// `policy.error` deny.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Requests inside an inspected tunnel only: the policy allows this request's `Upgrade`
    /// (`connection.upgrade`) explicitly. Without it the proxy refuses an upgrade
    /// (`egress.upgrade_not_allowed`): after a `101` no later byte would be decided.
    #[serde(default, skip_serializing_if = "is_false")]
    pub upgrade: bool,
}

impl EgressDecision {
    /// A deny carrying a single `policy.error` reason: what every engine failure turns into.
    pub fn deny_with_error(message: impl Into<String>) -> EgressDecision {
        EgressDecision {
            allow: false,
            reasons: Decision::deny_with_error(message).reasons,
            credentials: Vec::new(),
            upgrade: false,
        }
    }
}
