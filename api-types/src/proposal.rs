//! The closed sets of a policy proposal (`/v1/policy/proposals`): where it stands and who
//! opened it. The store keeps both as text (`policy_proposals.status`, `.origin`, with CHECK
//! constraints of the same sets) and decodes them here (`stored`).

use serde::{Deserialize, Serialize};

/// Where a proposal stands. Only an open proposal changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProposalStatus {
    Open,
    Approved,
    Rejected,
}

crate::text_forms::text_forms!(ProposalStatus {
    Open => "open",
    Approved => "approved",
    Rejected => "rejected",
});

/// Who opened a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProposalOrigin {
    /// A reviewer or an admin, with a patch or from the bundle's suggestion.
    Reviewer,
    /// An agent asking for what it was refused (`POST /v1/executions/{id}/access-request`).
    Agent,
}

crate::text_forms::text_forms!(ProposalOrigin {
    Reviewer => "reviewer",
    Agent => "agent",
});

/// What asking for access answers (`POST /v1/executions/{id}/access-request`, and the MCP tool
/// `request_access` over either transport): the proposal opened for a reviewer, by id, and where
/// it stands. Not its patch: for a network refusal that holds the tenant's whole allowlist, with
/// the names of its credentials, which are the reviewers' to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AccessRequested {
    pub proposal_id: String,
    pub status: ProposalStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_match_serde() {
        crate::text_forms::assert_serde_matches(ProposalStatus::ALL, |status| status.as_str());
        crate::text_forms::assert_serde_matches(ProposalOrigin::ALL, |origin| origin.as_str());
    }
}
