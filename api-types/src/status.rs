//! The statuses of an execution record, as one closed set: the API's `status`
//! field, the OpenAPI enum and the metrics' `status` label all come from here. The store keeps
//! them as text; [`ExecutionStatus::parse`] reads them back.

/// Final (or current) status of an execution record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Succeeded,
    Failed,
    Timeout,
    Oom,
    Killed,
    Cancelled,
    Denied,
    PendingApproval,
    Queued,
    Running,
    Error,
}

impl std::fmt::Display for ExecutionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ExecutionStatus {
    pub const ALL: [ExecutionStatus; 11] = [
        ExecutionStatus::Succeeded,
        ExecutionStatus::Failed,
        ExecutionStatus::Timeout,
        ExecutionStatus::Oom,
        ExecutionStatus::Killed,
        ExecutionStatus::Cancelled,
        ExecutionStatus::Denied,
        ExecutionStatus::PendingApproval,
        ExecutionStatus::Queued,
        ExecutionStatus::Running,
        ExecutionStatus::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Succeeded => "succeeded",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Timeout => "timeout",
            ExecutionStatus::Oom => "oom",
            ExecutionStatus::Killed => "killed",
            ExecutionStatus::Cancelled => "cancelled",
            ExecutionStatus::Denied => "denied",
            ExecutionStatus::PendingApproval => "pending_approval",
            ExecutionStatus::Queued => "queued",
            ExecutionStatus::Running => "running",
            ExecutionStatus::Error => "error",
        }
    }

    /// The status named `text`, if it is one.
    pub fn parse(text: &str) -> Option<ExecutionStatus> {
        ExecutionStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == text)
    }

    /// A status no execution leaves again.
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            ExecutionStatus::PendingApproval | ExecutionStatus::Queued | ExecutionStatus::Running
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in ExecutionStatus::ALL {
            assert_eq!(ExecutionStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(ExecutionStatus::parse("Succeeded"), None);
    }

    #[test]
    fn serde_and_the_text_form_agree() {
        for status in ExecutionStatus::ALL {
            assert_eq!(serde_json::json!(status), status.as_str());
        }
    }
}
