//! The E2B sandboxes' own facts (`e2b_sandboxes`): template, metadata, end of life, and the
//! hashes of the envd access tokens the E2B layer (`gateway/src/e2b`) issued for each. The
//! session row stays the record of the sandbox; these rows only add what E2B's API answers with.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use std::collections::BTreeMap;

use super::{key_hash, AuditError, AuditStore};
use crate::audit::ApiKey;
use crate::role::Role;

/// One E2B sandbox (`e2b_sandboxes`), its token hashes left out.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct E2bSandboxRow {
    pub session_id: String,
    pub tenant: String,
    pub key_id: String,
    pub template: String,
    pub metadata: Json<BTreeMap<String, String>>,
    pub allow_internet_access: Option<bool>,
    pub end_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "session_id, tenant, key_id, template, metadata, allow_internet_access, end_at, created_at";

impl AuditStore {
    /// Records a new E2B sandbox with the hash of its first access token.
    pub async fn insert_e2b_sandbox(
        &self,
        row: &E2bSandboxRow,
        token: &str,
    ) -> Result<(), AuditError> {
        sqlx::query(
            "INSERT INTO e2b_sandboxes (session_id, tenant, key_id, template, metadata, \
             allow_internet_access, token_hashes, end_at) \
             VALUES ($1, $2, $3, $4, $5, $6, ARRAY[$7], $8)",
        )
        .bind(&row.session_id)
        .bind(&row.tenant)
        .bind(&row.key_id)
        .bind(&row.template)
        .bind(&row.metadata)
        .bind(row.allow_internet_access)
        .bind(key_hash(token))
        .bind(row.end_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Adds the hash of one more access token (a `connect` answer) to the sandbox.
    pub async fn add_e2b_token(&self, session_id: &str, token: &str) -> Result<(), AuditError> {
        sqlx::query(
            "UPDATE e2b_sandboxes SET token_hashes = array_append(token_hashes, $2) \
             WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(key_hash(token))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn e2b_sandbox(&self, session_id: &str) -> Result<Option<E2bSandboxRow>, AuditError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM e2b_sandboxes WHERE session_id = $1"
        ))
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A tenant's E2B sandboxes, newest first.
    pub async fn e2b_sandboxes(&self, tenant: &str) -> Result<Vec<E2bSandboxRow>, AuditError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM e2b_sandboxes WHERE tenant = $1 \
             ORDER BY created_at DESC, session_id LIMIT 1000"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn set_e2b_end(
        &self,
        session_id: &str,
        end_at: DateTime<Utc>,
    ) -> Result<(), AuditError> {
        sqlx::query("UPDATE e2b_sandboxes SET end_at = $2 WHERE session_id = $1")
            .bind(session_id)
            .bind(end_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The sandbox `session_id` and the live key that created it, when `token` is one of the
    /// access tokens issued for that sandbox (and for no other: the hash must be on its row).
    pub async fn e2b_by_token(
        &self,
        session_id: &str,
        token: &str,
    ) -> Result<Option<(E2bSandboxRow, ApiKey)>, AuditError> {
        let found: Option<(String, Role, String, String)> = sqlx::query_as(
            "SELECT k.id, k.role, k.tenant, COALESCE(k.principal, k.id) \
             FROM e2b_sandboxes s JOIN api_keys k ON k.id = s.key_id \
             WHERE s.session_id = $1 AND $2 = ANY (s.token_hashes) \
             AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())",
        )
        .bind(session_id)
        .bind(key_hash(token))
        .fetch_optional(&self.pool)
        .await?;
        let Some((id, role, tenant, principal)) = found else {
            return Ok(None);
        };
        let Some(row) = self.e2b_sandbox(session_id).await? else {
            return Ok(None);
        };
        let key = ApiKey {
            id,
            role,
            tenant,
            principal,
        };
        Ok(Some((row, key)))
    }
}
