//! The `sessions` table: one row per session, its status and closing.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use super::{AuditError, AuditStore};
use crate::session_wire::{ClosedReason, SessionStatus};

/// One row of `sessions`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionRow {
    pub id: String,
    pub tenant: String,
    pub key_id: String,
    pub language: String,
    pub status: SessionStatus,
    pub closed_reason: Option<ClosedReason>,
    pub decision: Json<Value>,
    pub limits: Json<Value>,
    pub idle_timeout_s: i64,
    pub ttl_s: i64,
    pub executions: i64,
    pub instance: String,
    pub container: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    /// Set when it was held for review: its approval.
    pub approval_id: Option<crate::ids::ApprovalId>,
    /// `warm` (claimed from the pool) or `cold`; absent until its sandbox started.
    pub start: Option<api_types::SessionStart>,
}

/// A tenant already holds `max_sessions` sessions (open or waiting for review).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tenant already has {open} open or pending sessions (max_sessions {max})")]
pub struct SessionsFull {
    pub open: usize,
    pub max: usize,
}

/// Takes `tenant`'s session lock for the rest of `tx` (a PostgreSQL advisory lock, so every
/// replica waits on it), then counts its sessions not closed: `Err` when `max` are. The caller
/// inserts its session in the same transaction, so the count and the insert are one step.
pub(super) async fn session_room(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &str,
    max: usize,
) -> Result<Result<(), SessionsFull>, AuditError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('sandgate.sessions/' || $1, 0))")
        .bind(tenant)
        .execute(&mut **tx)
        .await?;
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sessions WHERE tenant = $1 AND status <> 'closed'",
    )
    .bind(tenant)
    .fetch_one(&mut **tx)
    .await?;
    let open = usize::try_from(open).unwrap_or(usize::MAX);
    if open >= max {
        return Ok(Err(SessionsFull { open, max }));
    }
    Ok(Ok(()))
}

impl SessionRow {
    /// Whether the session is in `status`.
    pub fn is(&self, status: SessionStatus) -> bool {
        self.status == status
    }
}

/// Most sessions one listing returns.
pub const MAX_LISTED: i64 = 500;

impl AuditStore {
    /// Inserts the started session `row` unless its tenant already has `max_sessions` sessions
    /// that are not closed (open or waiting for review, on any replica): counted and inserted
    /// under the tenant's lock ([`lock_tenant_sessions`]), so concurrent requests, here or on
    /// other replicas, cannot pass the limit together. `Err(Full)` names the count.
    pub async fn insert_session(
        &self,
        row: &SessionRow,
        max_sessions: usize,
    ) -> Result<Result<(), SessionsFull>, AuditError> {
        let mut tx = self.pool.begin().await?;
        if let Err(full) = session_room(&mut tx, &row.tenant, max_sessions).await? {
            return Ok(Err(full));
        }
        sqlx::query(
            "INSERT INTO sessions (id, tenant, key_id, language, status, decision, limits, \
             idle_timeout_s, ttl_s, instance, container, created_at, last_used_at, expires_at, start) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(&row.id)
        .bind(&row.tenant)
        .bind(&row.key_id)
        .bind(&row.language)
        .bind(row.status)
        .bind(&row.decision)
        .bind(&row.limits)
        .bind(row.idle_timeout_s)
        .bind(row.ttl_s)
        .bind(&row.instance)
        .bind(&row.container)
        .bind(row.created_at)
        .bind(row.last_used_at)
        .bind(row.expires_at)
        .bind(row.start)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Ok(()))
    }

    /// Sessions of `tenant` not closed (open or waiting for review), on every replica: what
    /// `max_sessions` bounds.
    pub async fn sessions_not_closed(&self, tenant: &str) -> Result<usize, AuditError> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sessions WHERE tenant = $1 AND status <> 'closed'",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(usize::try_from(count).unwrap_or(usize::MAX))
    }

    pub async fn get_session(&self, id: &str) -> Result<Option<SessionRow>, AuditError> {
        Ok(sqlx::query_as("SELECT * FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// A tenant's sessions (all tenants' with `None`), newest first.
    pub async fn list_sessions(&self, tenant: Option<&str>) -> Result<Vec<SessionRow>, AuditError> {
        Ok(sqlx::query_as(
            "SELECT * FROM sessions WHERE ($1::text IS NULL OR tenant = $1) \
             ORDER BY created_at DESC LIMIT $2",
        )
        .bind(tenant)
        .bind(MAX_LISTED)
        .fetch_all(&self.pool)
        .await?)
    }

    /// `ready` or `busy`; an execution that ended also counts and touches the session.
    pub async fn set_session_status(
        &self,
        id: &str,
        status: SessionStatus,
        ran_one: bool,
    ) -> Result<(), AuditError> {
        sqlx::query(
            "UPDATE sessions SET status = $2, executions = executions + $3::bigint, \
             last_used_at = now() WHERE id = $1 AND status <> 'closed'",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(i64::from(ran_one))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Closes a session once; returns its row as closed, or `None` if it already was.
    pub async fn close_session(
        &self,
        id: &str,
        reason: ClosedReason,
    ) -> Result<Option<SessionRow>, AuditError> {
        Ok(sqlx::query_as(
            "UPDATE sessions SET status = 'closed', closed_reason = $2, closed_at = now() \
             WHERE id = $1 AND status <> 'closed' RETURNING *",
        )
        .bind(id)
        .bind(reason.as_str())
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Closes every session of this gateway instance still open in the store but not held by
    /// this run (`open`): a previous run left it, and its sandbox does not outlive that run.
    pub async fn close_sessions_left(
        &self,
        instance: &str,
        open: &[String],
    ) -> Result<Vec<SessionRow>, AuditError> {
        Ok(sqlx::query_as(
            "UPDATE sessions SET status = 'closed', closed_reason = 'gateway_restart', \
             closed_at = now() WHERE status <> 'closed' AND instance = $1 \
             AND NOT (id = ANY($2)) RETURNING *",
        )
        .bind(instance)
        .bind(open)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Stores what a session execution's cell displayed.
    pub async fn set_results(
        &self,
        execution_id: &str,
        results: &api_types::CellResults,
    ) -> Result<(), AuditError> {
        sqlx::query("UPDATE executions SET results = $2 WHERE id = $1")
            .bind(execution_id)
            .bind(sqlx::types::Json(results))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Stores the final expression's `repr` of a session execution.
    pub async fn set_result(&self, execution_id: &str, result: &str) -> Result<(), AuditError> {
        sqlx::query("UPDATE executions SET result = $2 WHERE id = $1")
            .bind(execution_id)
            .bind(result)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
