//! `egress.connection`, `egress.request`, `egress.credential.misdirected` and
//! `egress.denied.repeated`: what the proxy let out of a sandbox, or refused. Each input names
//! the session when the traffic was a session's (`session_id`, absent otherwise: the one field
//! skipped when unset, as before these were typed); the execution is the event's own column.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `egress.connection`'s input: the attempt as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Connection {
    pub host: String,
    pub port: i32,
    pub scheme: String,
    pub sni: Option<String>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub resolved_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// `egress.connection`'s decision: the verdict and the egress policy's own reasons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectionVerdict {
    pub allow: bool,
    pub policy_reasons: Value,
}

/// `egress.request`'s input: one HTTP request inspected inside a connection (header names
/// only, the query as a hash).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub connection_id: String,
    pub host: String,
    pub port: i32,
    pub method: String,
    pub path: String,
    pub query_sha256: Option<String>,
    pub headers: Vec<String>,
    pub upgrade: bool,
    /// What an allowed `Upgrade` asked for (left out when none, as before upgrades were decided).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// `egress.request`'s decision: the verdict, the credentials injected, the policy's reasons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestVerdict {
    pub allow: bool,
    pub credentials: Vec<String>,
    pub policy_reasons: Value,
}

/// `egress.credential.misdirected`'s input: the connection cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Misdirected {
    pub connection_id: String,
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// A decision that is only a verdict (`egress.credential.misdirected`: `false`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub allow: bool,
}

/// `egress.denied.repeated`'s input: the window the counted denials fell in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeniedWindow {
    pub from: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// `egress.denied.repeated`'s decision: how many were denied, by reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeniedCount {
    pub allow: bool,
    pub count: u64,
    pub by_reason: BTreeMap<String, u64>,
}
