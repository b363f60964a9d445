//! `execution.cancel` and `execution.reaped`: an execution stopped by its agent, or closed
//! because nothing runs it any more. (`execution.decision` keeps the policy's own types:
//! `PolicyInput` and the decision it said.)

use serde::{Deserialize, Serialize};

use crate::status::ExecutionStatus;

/// `execution.cancel`'s input: who asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    pub requested_by: String,
    pub requested_by_tenant: String,
}

/// `execution.cancel`'s decision (always `true`: a refused cancel is not an event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancelled {
    pub cancel: bool,
}

/// `execution.reaped`'s input: which replica found it abandoned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Reaped {
    /// Its own replica, which no longer ran it (reason `execution.abandoned`).
    Abandoned { instance: String },
    /// Another replica, after its owner's lease expired (reason `lease.expired`).
    LeaseExpired { owner: String, closed_by: String },
}

/// The status a record was closed with (`execution.reaped`: `error`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Closed {
    pub status: ExecutionStatus,
}
