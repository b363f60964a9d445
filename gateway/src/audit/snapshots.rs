//! What snapshots (DESIGN 15) store beside the audit events: the `snapshots` table (one row
//! per kept checkpoint image, its sha256 and size, until it is deleted or expires) and, on an
//! execution that restored its paused session, `executions.resumed`; and `session_pauses`, a
//! paused session's checkpoint, so a restarted gateway serves it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use super::{AuditError, AuditStore};

/// One row of `snapshots`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SnapshotRow {
    pub id: String,
    pub tenant: String,
    pub key_id: String,
    pub session_id: String,
    pub language: String,
    /// The mounts the image was taken with (`[{source, target}]`).
    pub mounts: Json<Value>,
    pub path: String,
    pub bytes: i64,
    pub sha256: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
    /// Its session's grant inspected a destination (the image trusts that session's CA).
    pub inspected: bool,
}

const COLUMNS: &str = "id, tenant, key_id, session_id, language, mounts, path, bytes, sha256, \
                       created_at, expires_at, deleted_at, inspected";

/// One row of `session_pauses`: what a resume of a paused session needs.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PauseRow {
    pub session_id: String,
    pub image: String,
    pub sha256: String,
    pub bytes: i64,
    /// The floor the session was admitted with (`app::floor::Runnable`).
    pub runnable: Json<Value>,
    pub language: String,
    pub executions: i64,
    pub inspected: bool,
    pub closes_when_idle: bool,
}

impl AuditStore {
    /// Marks the execution as the one that restored its paused session.
    pub async fn mark_resumed(&self, execution_id: &str) -> Result<(), AuditError> {
        sqlx::query("UPDATE executions SET resumed = true WHERE id = $1")
            .bind(execution_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Bytes of the tenant's kept snapshots.
    pub async fn snapshot_bytes(&self, tenant: &str) -> Result<i64, AuditError> {
        let used: Option<i64> = sqlx::query_scalar(
            "SELECT sum(bytes)::bigint FROM snapshots WHERE tenant = $1 AND deleted_at IS NULL",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(used.unwrap_or(0))
    }

    pub async fn insert_snapshot(&self, row: &SnapshotRow) -> Result<(), AuditError> {
        sqlx::query(
            "INSERT INTO snapshots (id, tenant, key_id, session_id, language, mounts, path, \
             bytes, sha256, created_at, expires_at, inspected) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&row.id)
        .bind(&row.tenant)
        .bind(&row.key_id)
        .bind(&row.session_id)
        .bind(&row.language)
        .bind(&row.mounts)
        .bind(&row.path)
        .bind(row.bytes)
        .bind(&row.sha256)
        .bind(row.created_at)
        .bind(row.expires_at)
        .bind(row.inspected)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Stores a paused session's checkpoint and marks the session `paused`, in one
    /// transaction: a session is `paused` exactly when a restarted gateway can restore it.
    pub async fn store_pause(&self, row: &PauseRow) -> Result<(), AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO session_pauses (session_id, image, sha256, bytes, runnable, language, \
             executions, inspected, closes_when_idle) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (session_id) DO UPDATE SET image = $2, sha256 = $3, bytes = $4, \
             runnable = $5, language = $6, executions = $7, inspected = $8, \
             closes_when_idle = $9, paused_at = now()",
        )
        .bind(&row.session_id)
        .bind(&row.image)
        .bind(&row.sha256)
        .bind(row.bytes)
        .bind(&row.runnable)
        .bind(&row.language)
        .bind(row.executions)
        .bind(row.inspected)
        .bind(row.closes_when_idle)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE sessions SET status = 'paused' WHERE id = $1 AND status <> 'closed'")
            .bind(&row.session_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets a paused session's checkpoint (resumed or closed).
    pub async fn forget_pause(&self, session_id: &str) -> Result<(), AuditError> {
        sqlx::query("DELETE FROM session_pauses WHERE session_id = $1")
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The paused sessions this gateway instance left, with their checkpoints.
    pub async fn pauses_left(
        &self,
        instance: &str,
    ) -> Result<Vec<(super::sessions::SessionRow, PauseRow)>, AuditError> {
        let sessions: Vec<super::sessions::SessionRow> = sqlx::query_as(
            "SELECT s.* FROM sessions s JOIN session_pauses p ON p.session_id = s.id \
             WHERE s.instance = $1 AND s.status = 'paused' ORDER BY s.id",
        )
        .bind(instance)
        .fetch_all(&self.pool)
        .await?;
        let ids: Vec<String> = sessions.iter().map(|row| row.id.clone()).collect();
        let pauses: Vec<PauseRow> = sqlx::query_as(
            "SELECT session_id, image, sha256, bytes, runnable, language, executions, \
             inspected, closes_when_idle FROM session_pauses WHERE session_id = ANY($1) \
             ORDER BY session_id",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(super::pause_claims::pair_by_session(sessions, pauses))
    }

    /// A kept snapshot (not deleted, not expired).
    pub async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, AuditError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM snapshots WHERE id = $1 AND deleted_at IS NULL \
             AND expires_at > now()"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Kept snapshots, newest first; `None`: every tenant's.
    pub async fn list_snapshots(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<SnapshotRow>, AuditError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM snapshots WHERE deleted_at IS NULL AND expires_at > now() \
             AND ($1::text IS NULL OR tenant = $1) ORDER BY created_at DESC, id LIMIT 1000"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Marks a snapshot deleted once; returns its row if this call did.
    pub async fn delete_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, AuditError> {
        Ok(sqlx::query_as(&format!(
            "UPDATE snapshots SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL \
             RETURNING {COLUMNS}"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Snapshots past their `expires_at` and not yet deleted.
    pub async fn expired_snapshots(&self) -> Result<Vec<String>, AuditError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM snapshots WHERE deleted_at IS NULL AND expires_at <= now() LIMIT 1000",
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
