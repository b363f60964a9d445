//! Egress connection rows: one per attempt, inserted with its audit event before the proxy
//! dials, completed when the connection closes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::events::{self, egress};
use super::{chain, AuditError, AuditStore, NewEvent};
use crate::metrics::EgressDecision;

/// Whose a connection or request is: an execution's, or a session's (and the execution running
/// in it at that moment, if any). At least one of the two is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressOwner {
    pub execution_id: Option<String>,
    pub session_id: Option<String>,
}

/// An attempt as it is recorded (the proxy's `Attempt`, flattened for SQL).
#[derive(Debug, Clone)]
pub struct ConnectionOpen {
    pub owner: EgressOwner,
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

/// A row of `egress_connections`, as the API returns it. (Fields alphabetical, as the answer
/// always had them: it was a `json!` object, whose keys serde_json sorts.)
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ConnectionRow {
    pub allow: bool,
    pub bytes_down: i64,
    pub bytes_up: i64,
    pub close_reason: Option<String>,
    pub closed_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<i64>,
    pub error: Option<String>,
    pub host: String,
    pub id: String,
    pub message: String,
    pub method: Option<String>,
    pub opened_at: DateTime<Utc>,
    pub path: Option<String>,
    pub policy_revision: String,
    pub port: i32,
    pub reason: String,
    pub resolved_addr: Option<String>,
    pub scheme: String,
    pub sni: Option<String>,
}

impl AuditStore {
    /// Inserts the connection row and its audit event in one transaction; returns the row id.
    pub async fn open_connection(&self, open: &ConnectionOpen) -> Result<String, AuditError> {
        let id = crate::ids::new("cn");
        let started = std::time::Instant::now();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO egress_connections (id, execution_id, tenant, host, port, scheme, sni, \
             method, path, resolved_addr, allow, reason, message, policy_revision, opened_at, \
             session_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        )
        .bind(&id)
        .bind(&open.owner.execution_id)
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
        .bind(&open.owner.session_id)
        .execute(&mut *tx)
        .await?;
        let event = NewEvent {
            kind: api_types::EventKind::EgressConnection,
            execution_id: open.owner.execution_id.clone(),
            key_id: None,
            tenant: Some(open.tenant.clone()),
            decision_id: Some(id.clone()),
            allow: Some(open.allow),
            reasons: events::reason(&open.reason, &open.message),
            input: events::column(&egress::Connection {
                host: open.host.clone(),
                port: open.port,
                scheme: open.scheme.clone(),
                sni: open.sni.clone(),
                method: open.method.clone(),
                path: open.path.clone(),
                resolved_addr: open.resolved_addr.clone(),
                session_id: open.owner.session_id.clone(),
            }),
            decision: events::column(&egress::ConnectionVerdict {
                allow: open.allow,
                policy_reasons: open.policy_reasons.clone(),
            }),
            policy_revision: Some(open.policy_revision.clone()),
        };
        chain::append(&mut tx, &event).await?;
        tx.commit().await?;
        self.metrics.audit_appended(started.elapsed());
        self.metrics.egress(if open.allow {
            EgressDecision::Allow
        } else {
            EgressDecision::Deny
        });
        Ok(id)
    }

    /// An allowed connection the proxy cut because a credential placeholder went where its
    /// grant does not send it (the body of a plain-HTTP request): its own audit event, naming
    /// the connection and whose it is.
    pub async fn record_misdirected(&self, connection_id: &str) -> Result<(), AuditError> {
        let mut tx = self.pool.begin().await?;
        let owner: Option<(Option<String>, Option<String>, String, String)> = sqlx::query_as(
            "SELECT execution_id, session_id, tenant, host FROM egress_connections WHERE id = $1",
        )
        .bind(connection_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((execution_id, session_id, tenant, host)) = owner else {
            return Ok(());
        };
        let event = NewEvent {
            kind: api_types::EventKind::EgressCredentialMisdirected,
            execution_id,
            key_id: None,
            tenant: Some(tenant),
            decision_id: Some(connection_id.to_owned()),
            allow: Some(false),
            reasons: events::reason("credential.misdirected",
                "a credential placeholder in a request body the grant does not send it to; the connection was cut"),
            input: events::column(&egress::Misdirected {
                connection_id: connection_id.to_owned(),
                host,
                session_id,
            }),
            decision: events::column(&egress::Verdict { allow: false }),
            policy_revision: None,
        };
        chain::append(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(())
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

/// A request inside an inspected tunnel as it is recorded (the proxy's `InspectedRequest`).
#[derive(Debug, Clone)]
pub struct RequestOpen {
    pub connection_id: String,
    pub owner: EgressOwner,
    pub tenant: String,
    pub host: String,
    pub port: i32,
    pub method: String,
    pub path: String,
    pub query_sha256: Option<String>,
    pub header_names: Vec<String>,
    pub credentials: Vec<String>,
    /// The protocol an `Upgrade` request asked for (`upgrade` is then true).
    pub upgrade: Option<String>,
    pub allow: bool,
    pub reason: String,
    pub message: String,
    pub policy_reasons: Value,
    pub policy_revision: String,
    pub started_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct RequestClose {
    pub status_code: i32,
    pub bytes_up: i64,
    pub bytes_down: i64,
    pub duration_ms: i64,
    pub error: Option<String>,
}

impl AuditStore {
    /// Inserts the request row and its `egress.request` audit event in one transaction.
    pub async fn open_request(&self, open: &RequestOpen) -> Result<String, AuditError> {
        let id = crate::ids::new("rq");
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO egress_requests (id, connection_id, execution_id, tenant, host, port, \
             method, path, query_sha256, header_names, credentials, upgrade, allow, reason, \
             message, policy_revision, started_at, session_id, upgrade_protocol) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19)",
        )
        .bind(&id)
        .bind(&open.connection_id)
        .bind(&open.owner.execution_id)
        .bind(&open.tenant)
        .bind(&open.host)
        .bind(open.port)
        .bind(&open.method)
        .bind(&open.path)
        .bind(&open.query_sha256)
        .bind(&open.header_names)
        .bind(&open.credentials)
        .bind(open.upgrade.is_some())
        .bind(open.allow)
        .bind(&open.reason)
        .bind(&open.message)
        .bind(&open.policy_revision)
        .bind(open.started_at)
        .bind(&open.owner.session_id)
        .bind(&open.upgrade)
        .execute(&mut *tx)
        .await?;
        let event = NewEvent {
            kind: api_types::EventKind::EgressRequest,
            execution_id: open.owner.execution_id.clone(),
            key_id: None,
            tenant: Some(open.tenant.clone()),
            decision_id: Some(id.clone()),
            allow: Some(open.allow),
            reasons: events::reason(&open.reason, &open.message),
            input: events::column(&egress::Request {
                connection_id: open.connection_id.clone(),
                host: open.host.clone(),
                port: open.port,
                method: open.method.clone(),
                path: open.path.clone(),
                query_sha256: open.query_sha256.clone(),
                headers: open.header_names.clone(),
                upgrade: open.upgrade.is_some(),
                upgrade_protocol: open.upgrade.clone(),
                session_id: open.owner.session_id.clone(),
            }),
            decision: events::column(&egress::RequestVerdict {
                allow: open.allow,
                credentials: open.credentials.clone(),
                policy_reasons: open.policy_reasons.clone(),
            }),
            policy_revision: Some(open.policy_revision.clone()),
        };
        chain::append(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn close_request(&self, id: &str, close: &RequestClose) -> Result<(), AuditError> {
        sqlx::query(
            "UPDATE egress_requests SET finished_at = now(), status_code = $2, bytes_up = $3, \
             bytes_down = $4, duration_ms = $5, error = $6 WHERE id = $1",
        )
        .bind(id)
        .bind(close.status_code)
        .bind(close.bytes_up)
        .bind(close.bytes_down)
        .bind(close.duration_ms)
        .bind(&close.error)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
