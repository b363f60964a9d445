//! The wire types of sessions (DESIGN 10), serde only: the request bodies clients send, the
//! session view `api/sessions.rs` answers with, and the closed sets of session statuses and
//! closing reasons. The server serialises [`SessionView`]; `sandgate repl`, `sandgate exec
//! --session` and the MCP server's remote runner read it back with the same type, so a status
//! or reason the other side does not know is an error, never a silently wrong string. The store
//! keeps statuses and reasons as text; [`SessionStatus::parse`] and [`ClosedReason::parse`]
//! read them back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Held for a human reviewer; nothing runs yet.
    PendingApproval,
    /// Open and idle: the next execution may start.
    Ready,
    /// An execution runs; another one gets 409.
    Busy,
    /// Gone for good (see `closed_reason`).
    Closed,
}

/// Why a session closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClosedReason {
    /// `DELETE /v1/sessions/{id}`.
    Deleted,
    /// No execution for `idle_timeout_s`.
    Idle,
    /// Its lifetime (`ttl_s`) ended.
    Ttl,
    /// Out of memory.
    Oom,
    /// The interpreter or shell did not recover.
    Crashed,
    /// The gateway that held it stopped.
    GatewayRestart,
    /// The replica that held it stopped renewing its lease; another replica closed it.
    LeaseExpired,
    /// Held for review, and a reviewer rejected it.
    Denied,
    /// Held for review, and nobody decided before the approval expired.
    Expired,
    /// Approved, but its sandbox could not be started (the `session.closed` event says why).
    StartFailed,
}

macro_rules! text_forms {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// The value named `text` (as the store keeps it), if it is one.
            pub fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_forms!(SessionStatus {
    PendingApproval => "pending_approval",
    Ready => "ready",
    Busy => "busy",
    Closed => "closed",
});

text_forms!(ClosedReason {
    Deleted => "deleted",
    Idle => "idle",
    Ttl => "ttl",
    Oom => "oom",
    Crashed => "crashed",
    GatewayRestart => "gateway_restart",
    LeaseExpired => "lease_expired",
    Denied => "denied",
    Expired => "expired",
    StartFailed => "start_failed",
});

/// A session as `GET /v1/sessions/{id}` (and the other session routes) show it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionView {
    pub id: String,
    pub status: SessionStatus,
    pub closed_reason: Option<ClosedReason>,
    pub tenant: String,
    pub language: String,
    /// The policy's decision at creation (network, mounts, limits stay those).
    #[schema(value_type = Object)]
    pub decision: Value,
    #[schema(value_type = Object)]
    pub limits: Value,
    pub idle_timeout_s: i64,
    pub ttl_s: i64,
    /// Executions run in it so far.
    pub executions: i64,
    pub container: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    /// Set when the session was held for review: the approval a reviewer decides (or decided).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
}

/// A network destination asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destination {
    pub host: String,
    pub port: u16,
}

/// A file placed in `/workspace` before the code runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Upload {
    pub path: String,
    pub content_b64: String,
}

/// The body of `POST /v1/sessions`, as a client sends it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpenSession {
    pub language: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<Destination>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
}

/// The body of `POST /v1/sessions/{id}/executions`, as a client sends it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunInSession {
    pub code: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<Upload>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<TurnLimits>,
}

/// What one execution in a session may ask for (the rest was decided at creation).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct TurnLimits {
    pub timeout_ms: Option<u64>,
}

/// The part of an execution record (DESIGN 4.2) a session's client reads.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionRun {
    pub id: String,
    pub status: crate::status::ExecutionStatus,
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    pub session_id: Option<String>,
    /// The `repr` of a final Python expression.
    pub result: Option<String>,
    #[serde(default)]
    pub outputs: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip_through_serde() {
        for status in ["pending_approval", "ready", "busy", "closed"] {
            let parsed = SessionStatus::parse(status).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), status);
        }
        for reason in [
            "deleted",
            "idle",
            "ttl",
            "oom",
            "crashed",
            "gateway_restart",
            "lease_expired",
            "denied",
            "expired",
            "start_failed",
        ] {
            let parsed = ClosedReason::parse(reason).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), reason);
        }
        assert_eq!(SessionStatus::parse("Ready"), None);
        assert!(serde_json::from_value::<ClosedReason>("gone".into()).is_err());
    }
}
