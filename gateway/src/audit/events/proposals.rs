//! `policy.proposed`, `policy.proposal.rebased`, `policy.proposal.approved` and
//! `policy.proposal.rejected`: a policy proposal opened, built again on a new base, applied or
//! turned down. Every one carries the proposal as its input ([`Proposal`]); the decision says
//! what changed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use api_types::{ProposalOrigin, ProposalStatus};

/// The input of every proposal event: the proposal as it stands (its patch bounded: a large one
/// is kept as its size and SHA-256).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub proposal_id: String,
    pub title: String,
    pub origin: ProposalOrigin,
    pub author_key_id: String,
    pub source_execution: Option<String>,
    pub source_approval: Option<String>,
    pub base_revision: String,
    pub patch: Value,
}

/// The counts of a proposal's replay (its examples stay in the proposal's evidence). `None`
/// (`null`) where the evidence had no such count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayCounts {
    pub days: Option<u64>,
    pub total: Option<u64>,
    pub allow_to_deny: Option<u64>,
    pub deny_to_allow: Option<u64>,
    pub review_changes: Option<u64>,
    pub limit_changes: Option<u64>,
}

impl ReplayCounts {
    /// The counts of a replay evidence (`evidence.replay`).
    pub fn of(replay: &Value) -> ReplayCounts {
        let count = |name: &str| replay[name]["count"].as_u64();
        ReplayCounts {
            days: replay["days"].as_u64(),
            total: replay["total"].as_u64(),
            allow_to_deny: count("allow_to_deny"),
            deny_to_allow: count("deny_to_allow"),
            review_changes: count("review_changes"),
            limit_changes: count("limit_changes"),
        }
    }
}

/// `policy.proposed`'s decision: opened (`open`), with its candidate and evidence in brief.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposed {
    pub status: ProposalStatus,
    pub candidate_revision: String,
    pub tests_passed: bool,
    pub replay: ReplayCounts,
}

/// `policy.proposal.rebased`'s decision: still open, on a new base, with its new candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rebased {
    pub status: ProposalStatus,
    pub previous_base: String,
    pub previous_candidate: String,
    pub candidate_revision: String,
    pub tests_passed: bool,
    pub replay: ReplayCounts,
}

/// `policy.proposal.approved`'s decision: the revision it made active, and the one before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approved {
    pub status: ProposalStatus,
    pub revision: String,
    pub previous: String,
    pub comment: Option<String>,
}

/// `policy.proposal.rejected`'s decision, with the reviewer's comment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejected {
    pub status: ProposalStatus,
    pub comment: String,
}
