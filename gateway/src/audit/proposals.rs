//! Policy proposals (`policy_proposals`, issue 25): each write is committed with its audit event
//! (`policy.proposed`, `policy.proposal.approved`, `policy.proposal.rejected`) in one
//! transaction. Only an open proposal changes.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::types::Json;

use super::{chain, AuditError, AuditStore, NewEvent};

/// One stored proposal, as `GET /v1/policy/proposals/{id}` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ProposalRow {
    pub id: String,
    pub created_at: DateTime<Utc>,
    pub title: String,
    pub rationale: String,
    pub author_key_id: String,
    pub author_principal: String,
    pub author_tenant: String,
    /// `reviewer` (opened by a reviewer or admin) or `agent` (an agent asked for access).
    pub origin: String,
    /// The agent's own words, never trusted.
    pub justification: Option<String>,
    pub source_execution: Option<String>,
    pub source_approval: Option<String>,
    pub patch: Json<Value>,
    pub base_revision: String,
    pub candidate_revision: String,
    pub evidence: Json<Value>,
    pub tests_passed: bool,
    #[sqlx(try_from = "String")]
    pub status: ProposalStatus,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
    pub comment: Option<String>,
}

/// Where a proposal stands: a closed set, stored as its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProposalStatus {
    Open,
    Approved,
    Rejected,
}

impl ProposalStatus {
    pub const ALL: [ProposalStatus; 3] = [Self::Open, Self::Approved, Self::Rejected];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
        }
    }

    pub fn parse(text: &str) -> Option<ProposalStatus> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }
}

impl std::fmt::Display for ProposalStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored status outside the set fails the row's decoding (fail closed).
impl TryFrom<String> for ProposalStatus {
    type Error = String;

    fn try_from(text: String) -> Result<ProposalStatus, String> {
        ProposalStatus::parse(&text).ok_or_else(|| {
            format!("policy_proposals.status {text:?} is not open, approved or rejected")
        })
    }
}

/// The open proposals one key and one tenant have, for their bounds.
#[derive(Debug, Clone, Copy)]
pub struct OpenCounts {
    pub key: i64,
    pub tenant: i64,
}

impl AuditStore {
    /// Inserts the proposal and its `policy.proposed` event together.
    pub async fn insert_proposal(
        &self,
        row: &ProposalRow,
        event: &NewEvent,
    ) -> Result<(), AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO policy_proposals (id, created_at, title, rationale, author_key_id, \
             author_principal, author_tenant, origin, justification, source_execution, \
             source_approval, patch, base_revision, candidate_revision, evidence, tests_passed) \
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16)",
        )
        .bind(&row.id)
        .bind(row.created_at)
        .bind(&row.title)
        .bind(&row.rationale)
        .bind(&row.author_key_id)
        .bind(&row.author_principal)
        .bind(&row.author_tenant)
        .bind(&row.origin)
        .bind(&row.justification)
        .bind(&row.source_execution)
        .bind(&row.source_approval)
        .bind(&row.patch)
        .bind(&row.base_revision)
        .bind(&row.candidate_revision)
        .bind(&row.evidence)
        .bind(row.tests_passed)
        .execute(&mut *tx)
        .await?;
        chain::append(&mut tx, event).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn get_proposal(&self, id: &str) -> Result<Option<ProposalRow>, AuditError> {
        let row = sqlx::query_as("SELECT * FROM policy_proposals WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row)
    }

    /// One page, newest first: proposals created before `before` (an id; ids sort by time),
    /// with `status` when given.
    pub async fn list_proposals(
        &self,
        status: Option<ProposalStatus>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProposalRow>, AuditError> {
        let rows = sqlx::query_as(
            "SELECT * FROM policy_proposals WHERE ($1::text IS NULL OR status = $1) \
             AND ($2::text IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .bind(status.map(ProposalStatus::as_str))
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Open proposals authored by `key` and by keys of `tenant`.
    pub async fn open_proposals(&self, key: &str, tenant: &str) -> Result<OpenCounts, AuditError> {
        let (key_count, tenant_count): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE author_key_id = $1), \
             count(*) FILTER (WHERE author_tenant = $2) \
             FROM policy_proposals WHERE status = 'open' \
             AND (author_key_id = $1 OR author_tenant = $2)",
        )
        .bind(key)
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(OpenCounts {
            key: key_count,
            tenant: tenant_count,
        })
    }

    /// Rebased: the new base, candidate and evidence of an open proposal. False when it is not
    /// open any more.
    pub async fn rebase_proposal(&self, row: &ProposalRow) -> Result<bool, AuditError> {
        let done = sqlx::query(
            "UPDATE policy_proposals SET base_revision = $2, candidate_revision = $3, \
             evidence = $4, tests_passed = $5 WHERE id = $1 AND status = 'open'",
        )
        .bind(&row.id)
        .bind(&row.base_revision)
        .bind(&row.candidate_revision)
        .bind(&row.evidence)
        .bind(row.tests_passed)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Closes an open proposal (`approved` or `rejected`) with its event. False when it was not
    /// open (nothing is written then).
    pub async fn decide_proposal(
        &self,
        id: &str,
        status: ProposalStatus,
        (by, comment): (&str, Option<&str>),
        event: &NewEvent,
    ) -> Result<bool, AuditError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE policy_proposals SET status = $2, decided_at = now(), decided_by = $3, \
             comment = $4 WHERE id = $1 AND status = 'open'",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(by)
        .bind(comment)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        chain::append(&mut tx, event).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The decision event of execution `id` (its policy input and decision), if recorded.
    pub async fn execution_decision(&self, id: &str) -> Result<Option<(Value, Value)>, AuditError> {
        let row: Option<(Json<Value>, Json<Value>)> = sqlx::query_as(
            "SELECT input, decision FROM audit_events WHERE kind = 'execution.decision' \
             AND execution_id = $1 ORDER BY seq LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(input, decision)| (input.0, decision.0)))
    }
}
