//! Egress connection rows: one per attempt, inserted with its audit event before the proxy
//! dials, completed when the connection closes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{chain, AuditError, AuditStore, NewEvent};

/// An attempt as it is recorded (the proxy's `Attempt`, flattened for SQL).
#[derive(Debug, Clone)]
pub struct ConnectionOpen {
    pub execution_id: String,
    pub tenant: String,
    pub host: String,
    pub port: i32,
    pub scheme: String,
    pub sni: Option<String>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub resolved_addr: Option<String>,
    pub allow: bool,
    pub reason: String,
    pub message: String,
    pub policy_reasons: Value,
    pub policy_revision: String,
    pub opened_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionClose {
    pub bytes_up: i64,
    pub bytes_down: i64,
    pub duration_ms: i64,
    pub close_reason: String,
    pub error: Option<String>,
    /// When it closed (a replay from the journal writes this, not the time of the replay).
    pub closed_at: DateTime<Utc>,
}

/// A row of `egress_connections`, as the API returns it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ConnectionRow {
    pub id: String,
    pub host: String,
    pub port: i32,
    pub scheme: String,
    pub sni: Option<String>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub resolved_addr: Option<String>,
    pub allow: bool,
    pub reason: String,
    pub message: String,
    pub policy_revision: String,
    pub opened_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub bytes_up: i64,
    pub bytes_down: i64,
    pub duration_ms: Option<i64>,
    pub close_reason: Option<String>,
    pub error: Option<String>,
}

impl AuditStore {
    /// Inserts the connection row and its audit event in one transaction; returns the row id.
    pub async fn open_connection(&self, open: &ConnectionOpen) -> Result<String, AuditError> {
        let id = crate::ids::new("cn");
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO egress_connections (id, execution_id, tenant, host, port, scheme, sni, \
             method, path, resolved_addr, allow, reason, message, policy_revision, opened_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(&id)
        .bind(&open.execution_id)
        .bind(&open.tenant)
        .bind(&open.host)
        .bind(open.port)
        .bind(&open.scheme)
        .bind(&open.sni)
        .bind(&open.method)
        .bind(&open.path)
        .bind(&open.resolved_addr)
        .bind(open.allow)
        .bind(&open.reason)
        .bind(&open.message)
        .bind(&open.policy_revision)
        .bind(open.opened_at)
        .execute(&mut *tx)
        .await?;
        let event = NewEvent {
            kind: "egress.connection",
            execution_id: Some(open.execution_id.clone()),
            key_id: None,
            tenant: Some(open.tenant.clone()),
            decision_id: Some(id.clone()),
            allow: Some(open.allow),
            reasons: json!([{"code": open.reason, "message": open.message}]),
            input: json!({
                "host": open.host, "port": open.port, "scheme": open.scheme, "sni": open.sni,
                "method": open.method, "path": open.path, "resolved_addr": open.resolved_addr,
            }),
            decision: json!({"allow": open.allow, "policy_reasons": open.policy_reasons}),
            policy_revision: Some(open.policy_revision.clone()),
        };
        chain::append(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn close_connection(
        &self,
        id: &str,
        close: &ConnectionClose,
    ) -> Result<(), AuditError> {
        sqlx::query(
            "UPDATE egress_connections SET closed_at = $7, bytes_up = $2, bytes_down = $3, \
             duration_ms = $4, close_reason = $5, error = $6 WHERE id = $1",
        )
        .bind(id)
        .bind(close.bytes_up)
        .bind(close.bytes_down)
        .bind(close.duration_ms)
        .bind(&close.close_reason)
        .bind(close.error.as_deref().map(super::durable::without_nul))
        .bind(close.closed_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn connections(&self, execution_id: &str) -> Result<Vec<ConnectionRow>, AuditError> {
        let rows = sqlx::query_as(
            "SELECT id, host, port, scheme, sni, method, path, resolved_addr, allow, reason, \
             message, policy_revision, opened_at, closed_at, bytes_up, bytes_down, duration_ms, \
             close_reason, error FROM egress_connections WHERE execution_id = $1 \
             ORDER BY opened_at, id",
        )
        .bind(execution_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }
}
