//! `retention.purge`: the stored output of executions past the retention window was removed
//! (their records, decisions and events stay).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `retention.purge`'s input: the window and the executions purged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Purge {
    pub retention_days: u32,
    pub finished_before: DateTime<Utc>,
    pub executions: Vec<String>,
}

/// `retention.purge`'s decision: what was removed of each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Purged {
    pub purged: Vec<String>,
}
