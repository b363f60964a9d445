//! Walking the hash chain: every row's `prev_hash` must be the previous row's `hash`, every
//! `hash` must follow from `prev_hash` and the row by the row's scheme ([`chain::hash`]), and
//! `seq` must have no gap. A row changed in place (by someone who could bypass the triggers)
//! breaks its own hash.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chain::{self, HashScheme, Row, GENESIS};
use super::{AuditError, AuditStore};

/// Rows read per round trip.
const PAGE: i64 = 1000;

/// One row of `audit_events` with its links, as stored and as an export bundle carries it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StoredEvent {
    pub seq: i64,
    pub id: String,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub execution_id: Option<String>,
    pub key_id: Option<String>,
    pub tenant: Option<String>,
    pub decision_id: Option<String>,
    pub allow: Option<bool>,
    pub reasons: Value,
    pub input: Value,
    pub decision: Value,
    pub policy_revision: Option<String>,
    pub prev_hash: String,
    pub hash: String,
    /// How `hash` was made (scheme 1 for every event written before scheme 2 existed).
    #[schema(value_type = i16, minimum = 1, maximum = 2)]
    pub hash_version: HashScheme,
}

/// The columns of [`StoredEvent`], for `SELECT`s that read whole rows (the list appends write).
pub const STORED_COLUMNS: &str = chain::EVENT_COLUMNS;

impl StoredEvent {
    pub fn row(&self) -> Row<'_> {
        Row {
            seq: self.seq,
            id: &self.id,
            at: &self.at,
            kind: &self.kind,
            execution_id: self.execution_id.as_deref(),
            key_id: self.key_id.as_deref(),
            tenant: self.tenant.as_deref(),
            decision_id: self.decision_id.as_deref(),
            allow: self.allow,
            reasons: &self.reasons,
            input: &self.input,
            decision: &self.decision,
            policy_revision: self.policy_revision.as_deref(),
        }
    }
}

/// The first event that does not verify, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Broken {
    pub seq: i64,
    pub id: String,
    pub problem: String,
}

/// The walk of the hash chain: intact (`head` set) or `broken` at its first bad event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Verification {
    /// Events checked (all of them when the chain is intact).
    pub events: i64,
    /// Hash of the last event: the head to anchor outside the database.
    pub head: Option<String>,
    pub broken: Option<Broken>,
}

impl Verification {
    pub fn ok(&self) -> bool {
        self.broken.is_none()
    }

    /// `ok N events` or the first broken event, as `sandgate audit verify` prints it.
    pub fn summary(&self) -> String {
        match &self.broken {
            None => format!("ok {} events", self.events),
            Some(broken) => format!(
                "broken at event {} ({}): {}",
                broken.seq, broken.id, broken.problem
            ),
        }
    }
}

impl AuditStore {
    /// Walks the whole chain from the first event.
    pub async fn verify_chain(&self) -> Result<Verification, AuditError> {
        let mut expected_prev = GENESIS.to_owned();
        let mut expected_seq = 1;
        let mut checked = 0;
        loop {
            let page: Vec<StoredEvent> = sqlx::query_as(&format!(
                "SELECT {STORED_COLUMNS} FROM audit_events WHERE seq >= $1 ORDER BY seq LIMIT $2"
            ))
            .bind(expected_seq)
            .bind(PAGE)
            .fetch_all(&self.pool)
            .await?;
            if page.is_empty() {
                let head = (checked > 0).then_some(expected_prev);
                return Ok(Verification {
                    events: checked,
                    head,
                    broken: None,
                });
            }
            for event in &page {
                if let Some(problem) = check(event, expected_seq, &expected_prev) {
                    return Ok(Verification {
                        events: checked,
                        head: None,
                        broken: Some(Broken {
                            seq: event.seq,
                            id: event.id.clone(),
                            problem,
                        }),
                    });
                }
                checked += 1;
                expected_seq = event.seq + 1;
                expected_prev = event.hash.clone();
            }
        }
    }
}

/// What is wrong with `event` as the next link after `expected_seq - 1` with hash
/// `expected_prev`, or `None`: the one check the database walk and an offline bundle share.
pub fn check(event: &StoredEvent, expected_seq: i64, expected_prev: &str) -> Option<String> {
    if event.seq != expected_seq {
        return Some(format!(
            "expected event {expected_seq} next: events are missing"
        ));
    }
    if event.prev_hash != expected_prev {
        return Some("prev_hash does not match the previous event's hash".to_owned());
    }
    let recomputed = chain::hash(event.hash_version, &event.prev_hash, &event.row());
    if recomputed != event.hash {
        return Some("the row's content does not match its hash (modified)".to_owned());
    }
    None
}
