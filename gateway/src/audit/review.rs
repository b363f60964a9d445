//! What the review page's detail view reads beyond the execution row: the files the request
//! uploaded (names and sizes, from the decision event's input; never their content) and the
//! HTTP requests made inside inspected tunnels.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use super::{AuditError, AuditStore};

/// Most requests one execution's listing returns.
pub const MAX_REQUESTS: i64 = 1000;

/// One row of `egress_requests` as the API shows it (no query, only its hash). (Fields
/// alphabetical, as the answer always had them: it was a `json!` object.)
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct RequestRow {
    pub allow: bool,
    pub bytes_down: i64,
    pub bytes_up: i64,
    pub connection_id: String,
    pub credentials: Vec<String>,
    pub duration_ms: Option<i64>,
    pub host: String,
    pub id: String,
    pub message: String,
    pub method: String,
    pub path: String,
    pub port: i32,
    pub reason: String,
    pub started_at: DateTime<Utc>,
    pub status_code: Option<i32>,
}

impl AuditStore {
    /// What the execution's decision event recorded: the uploaded files (`[{"path","bytes"}]`,
    /// from the policy input) and the grant the policy gave (`{"network","mounts"}`). `None`
    /// when the execution has no decision event.
    pub async fn execution_grant(
        &self,
        execution_id: &str,
    ) -> Result<Option<(Value, Value)>, AuditError> {
        let row: Option<(Option<Value>, Option<Value>, Option<Value>)> = sqlx::query_as(
            "SELECT input -> 'request' -> 'files', decision -> 'network', decision -> 'mounts' \
             FROM audit_events WHERE execution_id = $1 AND kind = 'execution.decision' \
             ORDER BY seq LIMIT 1",
        )
        .bind(execution_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(files, network, mounts)| {
            let files = files.filter(Value::is_array).unwrap_or(json!([]));
            let grant = json!({
                "network": network.unwrap_or(Value::Null),
                "mounts": mounts.filter(Value::is_array).unwrap_or(json!([])),
            });
            (files, grant)
        }))
    }

    /// The execution's requests inside inspected tunnels, in order.
    pub async fn egress_requests(&self, execution_id: &str) -> Result<Vec<RequestRow>, AuditError> {
        Ok(sqlx::query_as(
            "SELECT id, connection_id, host, port, method, path, credentials, allow, reason, \
             message, started_at, status_code, bytes_up, bytes_down, duration_ms \
             FROM egress_requests WHERE execution_id = $1 ORDER BY started_at, id LIMIT $2",
        )
        .bind(execution_id)
        .bind(MAX_REQUESTS)
        .fetch_all(&self.pool)
        .await?)
    }
}
