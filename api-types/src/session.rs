//! The wire types of sessions: the request bodies, the session view the session
//! routes answer with, and the closed sets of session statuses and closing reasons. An
//! execution in a session answers with an [`crate::ExecutionView`]. The store keeps statuses and
//! reasons as text; [`SessionStatus::parse`] and [`ClosedReason::parse`] read them back.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::execution::FileUpload;
use crate::policy::{HostPort, RequestedLimits};

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Held for a human reviewer; nothing runs yet.
    PendingApproval,
    /// Open and idle: the next execution may start.
    Ready,
    /// An execution runs; another one gets 409.
    Busy,
    /// Checkpointed to disk: no sandbox, no memory held; the next execution (or
    /// `POST /v1/sessions/{id}/resume`) restores it with its state.
    Paused,
    /// Gone for good (see `closed_reason`).
    Closed,
}

/// What becomes of a session idle for `idle_timeout_s` (DESIGN 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Checkpointed to disk (`paused`); the next execution resumes it. The default while the
    /// gateway has snapshots enabled.
    Pause,
    /// Closed (`closed_reason: idle`); the default without snapshots.
    Close,
}

/// Why a session closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// How an execution or a session got its sandbox (`start` in their records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxStart {
    /// Claimed from the warm pool.
    Warm,
    /// Started for it.
    Cold,
    /// A session's sandbox restored from a snapshot (a resume or a fork).
    Restored,
}

crate::text_forms::text_forms!(SandboxStart {
    Warm => "warm",
    Cold => "cold",
    Restored => "restored",
});

crate::text_forms::text_forms!(SessionStatus {
    PendingApproval => "pending_approval",
    Ready => "ready",
    Busy => "busy",
    Paused => "paused",
    Closed => "closed",
});

crate::text_forms::text_forms!(ClosedReason {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionView {
    pub id: String,
    pub status: SessionStatus,
    pub closed_reason: Option<ClosedReason>,
    pub tenant: String,
    pub language: String,
    /// The policy's decision at creation (network, mounts, limits stay those).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub decision: Value,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
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
    /// How its sandbox was got: `warm` (claimed from the warm pool), `cold` (started for it) or
    /// `restored` (from a snapshot); absent until it started (and for sessions approved later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<SandboxStart>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
}

/// The body of `POST /v1/sessions`. Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    pub language: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<HostPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    #[serde(default, skip_serializing_if = "RequestedLimits::is_empty")]
    pub limits: RequestedLimits,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// `sn_...`: restore the new session from this snapshot (a fork; DESIGN 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// What becomes of it once idle; absent: `pause` while snapshots are enabled, else `close`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// Set only by the E2B layer (`/e2b`), for the policy input's `request.e2b`; never on the wire.
    #[serde(skip)]
    pub e2b: Option<crate::E2bInput>,
}

/// The body of `POST /v1/sessions/{id}/executions`. Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionExecutionRequest {
    pub code: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileUpload>,
    #[serde(default, skip_serializing_if = "TurnLimits::is_empty")]
    pub limits: TurnLimits,
    /// `false`: answer 202 with the record as soon as the turn has started (follow it on
    /// `/v1/executions/{id}/events`); otherwise (the default) answer when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    /// Set only by the E2B layer (`/e2b`), for the policy input's `request.e2b`; never on the wire.
    #[serde(skip)]
    pub e2b: Option<crate::E2bInput>,
}

/// What one execution in a session may ask for (the rest was decided at creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TurnLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl TurnLimits {
    pub fn is_empty(&self) -> bool {
        self.timeout_ms.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip_through_serde() {
        crate::text_forms::assert_serde_matches(SessionStatus::ALL, |status| status.as_str());
        crate::text_forms::assert_serde_matches(ClosedReason::ALL, |reason| reason.as_str());
        crate::text_forms::assert_serde_matches(SandboxStart::ALL, |start| start.as_str());
        assert_eq!(SessionStatus::parse("Ready"), None);
        assert!(serde_json::from_value::<ClosedReason>("gone".into()).is_err());
    }

    #[test]
    fn requests_leave_out_what_was_not_asked_for() {
        let open = SessionRequest {
            language: "python".to_owned(),
            idle_timeout_s: Some(60),
            ..SessionRequest::default()
        };
        let text = serde_json::to_string(&open).unwrap();
        assert_eq!(text, r#"{"language":"python","idle_timeout_s":60}"#);
        assert_eq!(serde_json::from_str::<SessionRequest>(&text).unwrap(), open);
        let run = SessionExecutionRequest {
            code: "x + 1".to_owned(),
            limits: TurnLimits {
                timeout_ms: Some(500),
            },
            ..SessionExecutionRequest::default()
        };
        assert_eq!(
            serde_json::to_string(&run).unwrap(),
            r#"{"code":"x + 1","limits":{"timeout_ms":500}}"#
        );
        let typo = r#"{"code":"1","limits":{"timeout":5}}"#;
        assert!(serde_json::from_str::<SessionExecutionRequest>(typo).is_err());
    }
}
