//! What snapshots (DESIGN 15) store beside the audit events: the `snapshots` table (one row
//! per kept checkpoint image, its sha256 and size, until it is deleted or expires) and, on an
//! execution that restored its paused session, `executions.resumed`.

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
}

const COLUMNS: &str = "id, tenant, key_id, session_id, language, mounts, path, bytes, sha256, \
                       created_at, expires_at, deleted_at";

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
             bytes, sha256, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
        .execute(&self.pool)
        .await?;
        Ok(())
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
