//! Read-only listings for the API: executions (newest first) and audit events (newest first),
//! each one bounded page at a time with a `before` cursor.

use api_types::EventKind;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use super::verify::{StoredEvent, STORED_COLUMNS};
use super::{AuditError, AuditStore, ExecutionRow};

/// A `kind` filter: one kind, or every kind of a family (`approval.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KindFilter {
    Exact(EventKind),
    Family(String),
}

impl KindFilter {
    /// Parses `approval.requested` or `approval.*`; `None` for anything no event can match.
    pub fn parse(text: &str) -> Option<KindFilter> {
        if let Some(family) = text.strip_suffix(".*") {
            return EventKind::ALL
                .iter()
                .any(|kind| kind.in_family(family))
                .then(|| KindFilter::Family(family.to_owned()));
        }
        EventKind::parse(text).map(KindFilter::Exact)
    }

    /// `(exact kind, family prefix "approval.")` for the query's two parameters.
    fn binds(filter: Option<&KindFilter>) -> (Option<&str>, Option<String>) {
        match filter {
            None => (None, None),
            Some(KindFilter::Exact(kind)) => (Some(kind.as_str()), None),
            Some(KindFilter::Family(family)) => (None, Some(format!("{family}."))),
        }
    }
}

/// Which executions to list. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct ExecutionFilter {
    /// Set for agents: only their own tenant's executions.
    pub tenant: Option<String>,
    pub status: Option<String>,
    /// Only executions carrying this label (`key`, `value`).
    pub label: Option<(String, String)>,
    /// Only the executions of this session.
    pub session: Option<String>,
    /// Only executions created before this one (the previous page's last id).
    pub before: Option<String>,
    pub limit: i64,
}

/// Which audit events to list. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub kind: Option<KindFilter>,
    pub execution_id: Option<String>,
    pub since: Option<DateTime<Utc>>,
    /// Only events with a smaller `seq` (the previous page's last `seq`).
    pub before: Option<i64>,
    pub limit: i64,
}

/// One `audit_events` row, whole: auditors see what was hashed, the hashes and their scheme.
pub type AuditEvent = StoredEvent;

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
             AND ($5::text IS NULL OR labels @> jsonb_build_object($5::text, $6::text)) \
             AND ($7::text IS NULL OR session_id = $7) \
             ORDER BY created_at DESC, id DESC LIMIT $4",
        )
        .bind(&filter.tenant)
        .bind(&filter.status)
        .bind(&filter.before)
        .bind(filter.limit)
        .bind(filter.label.as_ref().map(|(key, _)| key))
        .bind(filter.label.as_ref().map(|(_, value)| value))
        .bind(&filter.session)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Audit events matching `filter`, newest first (`seq` descending).
    pub async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditEvent>, AuditError> {
        let (exact, family) = KindFilter::binds(filter.kind.as_ref());
        let rows = sqlx::query_as(&format!(
            "SELECT {STORED_COLUMNS} FROM audit_events \
             WHERE ($1::text IS NULL OR kind = $1) \
             AND ($2::text IS NULL OR execution_id = $2) \
             AND ($3::timestamptz IS NULL OR at >= $3) \
             AND ($4::bigint IS NULL OR seq < $4) \
             AND ($6::text IS NULL OR starts_with(kind, $6)) \
             ORDER BY seq DESC LIMIT $5"
        ))
        .bind(exact)
        .bind(&filter.execution_id)
        .bind(filter.since)
        .bind(filter.before)
        .bind(filter.limit)
        .bind(family)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Stores how the live stream split the output of `id` (see migration `stream_layout`).
    pub async fn save_stream_layout(&self, id: &str, layout: &Value) -> Result<(), AuditError> {
        sqlx::query("UPDATE executions SET stream_layout = $2 WHERE id = $1")
            .bind(id)
            .bind(Json(layout))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The stored stream layout of `id`, if any.
    pub async fn stream_layout(&self, id: &str) -> Result<Option<Value>, AuditError> {
        let layout: Option<(Option<Json<Value>>,)> =
            sqlx::query_as("SELECT stream_layout FROM executions WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(layout.and_then(|(layout,)| layout.map(|Json(value)| value)))
    }

    /// Whether execution `id` exists (within `tenant`, when given): a listing's `before` must
    /// name one, or the page could only ever be empty.
    pub async fn execution_visible(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<bool, AuditError> {
        let found: Option<(String,)> = sqlx::query_as(
            "SELECT id FROM executions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
        )
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }
}
