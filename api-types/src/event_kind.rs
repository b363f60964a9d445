//! The kinds of audit events the gateway writes (`audit_events.kind`), as one closed set: the
//! writers name an [`EventKind`], `GET /v1/audit/events?kind=` accepts only these (or a family
//! such as `approval.*`), and the answers carry their text form.

use serde::{Deserialize, Serialize};

/// What an audit event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventKind {
    #[serde(rename = "approval.approved")]
    ApprovalApproved,
    #[serde(rename = "approval.expired")]
    ApprovalExpired,
    #[serde(rename = "approval.refused")]
    ApprovalRefused,
    #[serde(rename = "approval.rejected")]
    ApprovalRejected,
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    #[serde(rename = "approval.withdrawn")]
    ApprovalWithdrawn,
    #[serde(rename = "auth.failure")]
    AuthFailure,
    #[serde(rename = "auth.failure.repeated")]
    AuthFailureRepeated,
    #[serde(rename = "egress.connection")]
    EgressConnection,
    #[serde(rename = "egress.credential.misdirected")]
    EgressCredentialMisdirected,
    #[serde(rename = "egress.denied.repeated")]
    EgressDeniedRepeated,
    #[serde(rename = "egress.request")]
    EgressRequest,
    #[serde(rename = "execution.cancel")]
    ExecutionCancel,
    #[serde(rename = "execution.decision")]
    ExecutionDecision,
    #[serde(rename = "execution.reaped")]
    ExecutionReaped,
    #[serde(rename = "key.create")]
    KeyCreate,
    #[serde(rename = "key.revoke")]
    KeyRevoke,
    #[serde(rename = "key.rotate")]
    KeyRotate,
    #[serde(rename = "policy.evaluate")]
    PolicyEvaluate,
    #[serde(rename = "policy.proposal.approved")]
    PolicyProposalApproved,
    #[serde(rename = "policy.proposal.rejected")]
    PolicyProposalRejected,
    #[serde(rename = "policy.proposed")]
    PolicyProposed,
    #[serde(rename = "policy.reload")]
    PolicyReload,
    #[serde(rename = "queue.refused")]
    QueueRefused,
    #[serde(rename = "queue.refused.repeated")]
    QueueRefusedRepeated,
    #[serde(rename = "request.cross_tenant")]
    RequestCrossTenant,
    #[serde(rename = "request.cross_tenant.repeated")]
    RequestCrossTenantRepeated,
    #[serde(rename = "request.traversal")]
    RequestTraversal,
    #[serde(rename = "request.traversal.repeated")]
    RequestTraversalRepeated,
    #[serde(rename = "retention.purge")]
    RetentionPurge,
    #[serde(rename = "session.closed")]
    SessionClosed,
    #[serde(rename = "session.created")]
    SessionCreated,
    #[serde(rename = "session.denied")]
    SessionDenied,
    #[serde(rename = "session.file_moved")]
    SessionFileMoved,
    #[serde(rename = "session.file_removed")]
    SessionFileRemoved,
    #[serde(rename = "session.file_written")]
    SessionFileWritten,
}

crate::text_forms::text_forms!(EventKind {
    ApprovalApproved => "approval.approved",
    ApprovalExpired => "approval.expired",
    ApprovalRefused => "approval.refused",
    ApprovalRejected => "approval.rejected",
    ApprovalRequested => "approval.requested",
    ApprovalWithdrawn => "approval.withdrawn",
    AuthFailure => "auth.failure",
    AuthFailureRepeated => "auth.failure.repeated",
    EgressConnection => "egress.connection",
    EgressCredentialMisdirected => "egress.credential.misdirected",
    EgressDeniedRepeated => "egress.denied.repeated",
    EgressRequest => "egress.request",
    ExecutionCancel => "execution.cancel",
    ExecutionDecision => "execution.decision",
    ExecutionReaped => "execution.reaped",
    KeyCreate => "key.create",
    KeyRevoke => "key.revoke",
    KeyRotate => "key.rotate",
    PolicyEvaluate => "policy.evaluate",
    PolicyProposalApproved => "policy.proposal.approved",
    PolicyProposalRejected => "policy.proposal.rejected",
    PolicyProposed => "policy.proposed",
    PolicyReload => "policy.reload",
    QueueRefused => "queue.refused",
    QueueRefusedRepeated => "queue.refused.repeated",
    RequestCrossTenant => "request.cross_tenant",
    RequestCrossTenantRepeated => "request.cross_tenant.repeated",
    RequestTraversal => "request.traversal",
    RequestTraversalRepeated => "request.traversal.repeated",
    RetentionPurge => "retention.purge",
    SessionClosed => "session.closed",
    SessionCreated => "session.created",
    SessionDenied => "session.denied",
    SessionFileMoved => "session.file_moved",
    SessionFileRemoved => "session.file_removed",
    SessionFileWritten => "session.file_written",
});

impl EventKind {
    /// Whether the kind belongs to `family` (`approval` for `approval.*`).
    pub fn in_family(self, family: &str) -> bool {
        self.as_str()
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with('.'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_names_match_the_text_form() {
        crate::text_forms::assert_serde_matches(EventKind::ALL, |kind| kind.as_str());
        assert_eq!(
            EventKind::parse("session.created"),
            Some(EventKind::SessionCreated)
        );
        assert_eq!(EventKind::parse("session"), None);
    }

    #[test]
    fn kinds_are_unique_and_sorted() {
        let names: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn families() {
        assert!(EventKind::ApprovalExpired.in_family("approval"));
        assert!(EventKind::AuthFailureRepeated.in_family("auth.failure"));
        assert!(!EventKind::AuthFailure.in_family("auth.failure"));
        assert!(!EventKind::KeyCreate.in_family("ke"));
    }
}
