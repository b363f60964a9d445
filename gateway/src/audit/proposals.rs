//! Policy proposals (`policy_proposals`, issue 25): each write is committed with its audit event
//! (`policy.proposed`, `policy.proposal.rebased`, `policy.proposal.approved`,
//! `policy.proposal.rejected`) in one transaction. Only an open proposal changes.
//!
//! Two advisory locks make the checks hold across replicas: a tenant's proposal lock around
//! counting its open proposals and inserting one (the bound is not check-then-insert), and the
//! policy lock around an activation ([`Activation`]): the revision last activated on any replica
//! (`policy_active`) is read, an approved proposal claimed, and the new revision, its events and
//! the proposal's approval committed together, or nothing is.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::types::Json;

use super::{chain, AuditError, AuditStore, NewEvent, StoredDecision};

/// The closed sets of a stored proposal: a text outside them fails the row's decoding
/// (`audit::unknown_value`: fail closed, logged once, counted).
pub use api_types::{ProposalOrigin, ProposalStatus};

/// The advisory lock every activation of a policy revision holds (one key: "sgpolicy").
const POLICY_LOCK: i64 = 0x7367_706f_6c69_6379;
/// The class of the per-tenant lock around the open-proposal bound (with `hashtext(tenant)`).
const PROPOSALS_LOCK_CLASS: i32 = 0x7370_7270; // "sprp"

/// One stored proposal, as `GET /v1/policy/proposals/{id}` shows it. (Fields alphabetical, as
/// the answer always had them: it was a `json!` object, whose keys serde_json sorts.)
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ProposalRow {
    pub author_key_id: String,
    pub author_principal: String,
    pub author_tenant: String,
    pub base_revision: String,
    pub candidate_revision: String,
    pub comment: Option<String>,
    pub created_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
    /// The candidate's tests and the replay of recorded decisions against it (a listed
    /// proposal leaves out `files`).
    #[schema(value_type = Object)]
    pub evidence: Json<Value>,
    pub id: String,
    /// The agent's own words, never trusted.
    pub justification: Option<String>,
    /// Opened by a reviewer or admin, or by an agent asking for access.
    pub origin: ProposalOrigin,
    /// `{"data/<file>.yaml": <JSON merge patch>}`.
    #[schema(value_type = Object)]
    pub patch: Json<Value>,
    pub rationale: String,
    pub source_approval: Option<String>,
    pub source_execution: Option<String>,
    pub status: ProposalStatus,
    pub tests_passed: bool,
    pub title: String,
}

/// The open proposals one key and one tenant have, for their bounds.
#[derive(Debug, Clone, Copy)]
pub struct OpenCounts {
    pub key: i64,
    pub tenant: i64,
}

impl AuditStore {
    /// Inserts the proposal and its `policy.proposed` event together, unless its author key
    /// already has `bounds.key` open proposals or its tenant `bounds.tenant`: counted and
    /// inserted under the tenant's proposal lock, so concurrent creations (on any replica)
    /// cannot pass the bound together. `Some(counts)` when refused (nothing is written).
    pub async fn insert_proposal(
        &self,
        row: &ProposalRow,
        event: &NewEvent,
        bounds: OpenCounts,
    ) -> Result<Option<OpenCounts>, AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(PROPOSALS_LOCK_CLASS)
            .bind(&row.author_tenant)
            .execute(&mut *tx)
            .await?;
        let open = open_counts(&mut tx, &row.author_key_id, &row.author_tenant).await?;
        if open.key >= bounds.key || open.tenant >= bounds.tenant {
            return Ok(Some(open));
        }
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
        .bind(row.origin)
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
        Ok(None)
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

    /// Open proposals authored by `key` and by keys of `tenant` (a quick early refusal; the
    /// bound itself is held by [`AuditStore::insert_proposal`]).
    pub async fn open_proposals(&self, key: &str, tenant: &str) -> Result<OpenCounts, AuditError> {
        let mut conn = self.pool.acquire().await?;
        Ok(open_counts(&mut conn, key, tenant).await?)
    }

    /// Rebased: the new base, candidate and evidence of an open proposal, with its
    /// `policy.proposal.rebased` event. False when it is not open any more (nothing written).
    pub async fn rebase_proposal(
        &self,
        row: &ProposalRow,
        event: &NewEvent,
    ) -> Result<bool, AuditError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE policy_proposals SET base_revision = $2, candidate_revision = $3, \
             evidence = $4, tests_passed = $5 WHERE id = $1 AND status = 'open'",
        )
        .bind(&row.id)
        .bind(&row.base_revision)
        .bind(&row.candidate_revision)
        .bind(&row.evidence)
        .bind(row.tests_passed)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        chain::append(&mut tx, event).await?;
        tx.commit().await?;
        Ok(true)
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

/// Open proposals of `key` and of `tenant`'s keys, on `conn` (a transaction holding the
/// tenant's proposal lock, for the bound).
async fn open_counts(
    conn: &mut sqlx::PgConnection,
    key: &str,
    tenant: &str,
) -> Result<OpenCounts, sqlx::Error> {
    let (key_count, tenant_count): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE author_key_id = $1), \
         count(*) FILTER (WHERE author_tenant = $2) \
         FROM policy_proposals WHERE status = 'open' \
         AND (author_key_id = $1 OR author_tenant = $2)",
    )
    .bind(key)
    .bind(tenant)
    .fetch_one(conn)
    .await?;
    Ok(OpenCounts {
        key: key_count,
        tenant: tenant_count,
    })
}

impl AuditStore {
    /// How many proposals agent key `key` opened by access-request since `since` (whatever
    /// became of them), for `proposals.access_requests_per_hour`.
    pub async fn agent_proposals_since(
        &self,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<i64, AuditError> {
        let count = sqlx::query_scalar(
            "SELECT count(*) FROM policy_proposals WHERE author_key_id = $1 \
             AND origin = 'agent' AND created_at >= $2",
        )
        .bind(key)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        Ok(count)
    }
}

/// The newest recorded decisions of a window, for a proposal's replay.
#[derive(Debug)]
pub struct RecentDecisions {
    /// Oldest first, at most the limit asked for.
    pub decisions: Vec<StoredDecision>,
    /// Whether the window held more (the oldest were left out).
    pub truncated: bool,
}

impl AuditStore {
    /// The newest `limit` policy decisions recorded since `since` (the ones
    /// [`AuditStore::execution_decisions_since`] reads), oldest first, and whether there were
    /// more: a proposal's replay reads a bounded number of rows whatever the history holds.
    pub async fn execution_decisions_recent(
        &self,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<RecentDecisions, AuditError> {
        let wanted = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let mut decisions: Vec<StoredDecision> = sqlx::query_as(
            "SELECT execution_id, session_id, at, input, decision FROM ( \
               SELECT seq, execution_id, NULL::text AS session_id, at, input, decision \
               FROM audit_events WHERE kind = 'execution.decision' AND at >= $1 \
               UNION ALL \
               SELECT seq, NULL, input->>'session_id', at, input->'request', \
               coalesce(decision->'policy', decision) FROM audit_events \
               WHERE kind IN ('session.created', 'session.denied', 'approval.requested') \
               AND at >= $1 AND input ? 'session_id' AND input ? 'request') AS d \
             ORDER BY seq DESC LIMIT $2",
        )
        .bind(since)
        .bind(wanted)
        .fetch_all(&self.pool)
        .await?;
        let truncated = decisions.len() > limit;
        decisions.truncate(limit);
        decisions.reverse();
        Ok(RecentDecisions {
            decisions,
            truncated,
        })
    }

    /// Begins an activation of a policy revision: takes the policy lock (every replica's
    /// activations and approvals wait for each other here) and reads the revision last
    /// activated on any replica. Dropped without [`Activation::commit`]: nothing is written.
    pub async fn begin_activation(&self) -> Result<Activation, AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(POLICY_LOCK)
            .execute(&mut *tx)
            .await?;
        let active = sqlx::query_scalar("SELECT revision FROM policy_active")
            .fetch_optional(&mut *tx)
            .await?;
        Ok(Activation { tx, active })
    }

    /// At start-up: `revision`, the one this replica loaded, is the last activated.
    pub async fn record_startup_revision(&self, revision: &str) -> Result<(), AuditError> {
        let mut activation = self.begin_activation().await?;
        let active = Activated {
            revision,
            loaded_by: "startup",
            source: "startup",
            proposal: None,
        };
        activation.record(&active).await?;
        activation.tx.commit().await?;
        Ok(())
    }
}

/// What an activation makes the active revision.
#[derive(Debug, Clone, Copy)]
pub struct Activated<'a> {
    pub revision: &'a str,
    pub loaded_by: &'a str,
    pub source: &'a str,
    pub proposal: Option<&'a str>,
}

/// One activation, holding the policy lock until it commits or is dropped (rolled back).
pub struct Activation {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// The revision last activated on any replica; `None` before the first.
    pub active: Option<String>,
}

impl Activation {
    /// Claims open proposal `id` for approval by `by`, if it is still open and its candidate
    /// is still `candidate` (the one the reviewer was shown): the row is marked approved and
    /// stays locked until the activation commits; a rejection, rebase or second approval
    /// waits and then finds it closed. `None` when it is not (nothing changed).
    pub async fn claim_proposal(
        &mut self,
        id: &str,
        candidate: &str,
        (by, comment): (&str, Option<&str>),
    ) -> Result<Option<ProposalRow>, AuditError> {
        let row = sqlx::query_as(
            "UPDATE policy_proposals SET status = 'approved', decided_at = now(), \
             decided_by = $3, comment = $4 \
             WHERE id = $1 AND status = 'open' AND candidate_revision = $2 RETURNING *",
        )
        .bind(id)
        .bind(candidate)
        .bind(by)
        .bind(comment)
        .fetch_optional(&mut *self.tx)
        .await?;
        Ok(row)
    }

    async fn record(&mut self, active: &Activated<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO policy_active (singleton, revision, loaded_by, source, proposal) \
             VALUES (true, $1, $2, $3, $4) ON CONFLICT (singleton) DO UPDATE SET \
             revision = $1, loaded_by = $2, source = $3, proposal = $4, updated_at = now()",
        )
        .bind(active.revision)
        .bind(active.loaded_by)
        .bind(active.source)
        .bind(active.proposal)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Makes `active` the active revision and appends `events` (the reload's, an approval's),
    /// committed with the claimed proposal, if any.
    pub async fn commit(
        mut self,
        active: &Activated<'_>,
        events: &[&NewEvent],
    ) -> Result<(), AuditError> {
        self.record(active).await?;
        chain::append_many(&mut self.tx, events).await?;
        self.tx.commit().await?;
        Ok(())
    }
}
