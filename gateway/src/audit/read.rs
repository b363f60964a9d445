//! Read-only listings for the API: executions (newest first) and audit events (newest first),
//! each one bounded page at a time with a `before` cursor.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::types::Json;

use super::{AuditError, AuditStore, ExecutionRow};

/// Every value `executions.status` may take (the table's CHECK constraint).
pub const STATUSES: &[&str] = &[
    "succeeded",
    "failed",
    "timeout",
    "oom",
    "killed",
    "cancelled",
    "denied",
    "pending_approval",
    "queued",
    "running",
    "error",
];

/// Which executions to list. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct ExecutionFilter {
    /// Set for agents: only their own tenant's executions.
    pub tenant: Option<String>,
    pub status: Option<String>,
    /// Only executions created before this one (the previous page's last id).
    pub before: Option<String>,
    pub limit: i64,
}

/// Which audit events to list. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub kind: Option<String>,
    pub execution_id: Option<String>,
    pub since: Option<DateTime<Utc>>,
    /// Only events with a smaller `seq` (the previous page's last `seq`).
    pub before: Option<i64>,
    pub limit: i64,
}

/// One `audit_events` row, whole: auditors see what was hashed and the hashes.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct AuditEvent {
    pub seq: i64,
    pub id: String,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub execution_id: Option<String>,
    pub key_id: Option<String>,
    pub tenant: Option<String>,
    pub decision_id: Option<String>,
    pub allow: Option<bool>,
    pub reasons: Json<Value>,
    pub input: Json<Value>,
    pub decision: Json<Value>,
    pub policy_revision: Option<String>,
    pub prev_hash: String,
    pub hash: String,
}

impl AuditStore {
    /// Executions matching `filter`, newest first (`created_at`, then `id`, descending), without
    /// their stdout and stderr (`None`: up to the output ceiling each; the record has them).
    pub async fn list_executions(
        &self,
        filter: &ExecutionFilter,
    ) -> Result<Vec<ExecutionRow>, AuditError> {
        let rows = sqlx::query_as(
            "SELECT id, tenant, key_id, language, code_sha256, code_bytes, labels, status, \
             decision_id, allow, reasons, backend, runtime, image, limits, policy_revision, \
             created_at, started_at, finished_at, exit_code, duration_ms, NULL::bytea AS stdout, \
             NULL::bytea AS stderr, stdout_truncated, stderr_truncated, outputs, error, instance, \
             outputs_skipped, outputs_truncated, purged_at, start, container, session_id, \
             result FROM executions \
             WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR status = $2) \
             AND ($3::text IS NULL OR (created_at, id) < \
                  (SELECT created_at, id FROM executions WHERE id = $3 \
                   AND ($1::text IS NULL OR tenant = $1))) \
             ORDER BY created_at DESC, id DESC LIMIT $4",
        )
        .bind(&filter.tenant)
        .bind(&filter.status)
        .bind(&filter.before)
        .bind(filter.limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Audit events matching `filter`, newest first (`seq` descending).
    pub async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditEvent>, AuditError> {
        let rows = sqlx::query_as(
            "SELECT seq, id, at, kind, execution_id, key_id, tenant, decision_id, allow, \
             reasons, input, decision, policy_revision, prev_hash, hash FROM audit_events \
             WHERE ($1::text IS NULL OR kind = $1) \
             AND ($2::text IS NULL OR execution_id = $2) \
             AND ($3::timestamptz IS NULL OR at >= $3) \
             AND ($4::bigint IS NULL OR seq < $4) \
             ORDER BY seq DESC LIMIT $5",
        )
        .bind(&filter.kind)
        .bind(&filter.execution_id)
        .bind(filter.since)
        .bind(filter.before)
        .bind(filter.limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }
}
