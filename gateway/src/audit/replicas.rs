//! What replicas share through the database: the `replicas` table (heartbeat and
//! the policy revision each one runs), the leases on running records, the closing of another
//! replica's records once their lease expired, and the output files every replica can serve.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::postgres::PgListener;

use super::{chain, events, AuditError, AuditStore, NewEvent};
use crate::status::ExecutionStatus;

/// One replica as the others see it.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct ReplicaRow {
    pub instance: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub policy_revision: String,
    pub policy_error: Option<String>,
}

/// Records closed by [`AuditStore::close_expired`].
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Expired {
    pub executions: usize,
    pub sessions: usize,
}

/// `ms` as the `float8` PostgreSQL multiplies `interval '1 millisecond'` by.
fn millis(ms: u64) -> f64 {
    ms as f64
}

/// Why a survivor closed a record: `closed by <instance>: owner <instance> lease expired`.
pub fn expired_reason(by: &str, owner: &str) -> String {
    format!("closed by {by}: owner {owner} lease expired")
}

impl AuditStore {
    /// Names this replica (or names it again after a restart) with the revision it runs.
    pub async fn register_replica(&self, instance: &str, revision: &str) -> Result<(), AuditError> {
        sqlx::query(
            "INSERT INTO replicas (instance, started_at, heartbeat_at, policy_revision) \
             VALUES ($1, now(), now(), $2) ON CONFLICT (instance) DO UPDATE SET \
             started_at = now(), heartbeat_at = now(), policy_revision = $2, policy_error = NULL",
        )
        .bind(instance)
        .bind(revision)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// This replica is alive and runs `revision` (or says why not the announced one): renews
    /// its heartbeat and the lease of every record it runs, and returns which of `live` (the
    /// executions it runs) another replica has closed meanwhile (it was declared dead), so it
    /// stops them instead of bringing them back.
    pub async fn renew(
        &self,
        instance: &str,
        (revision, policy_error): (&str, Option<&str>),
        lease_ms: u64,
        live: &[String],
    ) -> Result<Vec<String>, AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE replicas SET heartbeat_at = now(), policy_revision = $2, policy_error = $3 \
             WHERE instance = $1",
        )
        .bind(instance)
        .bind(revision)
        .bind(policy_error)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE executions SET lease_until = now() + $2 * interval '1 millisecond' \
             WHERE instance = $1 AND finished_at IS NULL AND status IN ('queued', 'running') \
             AND id = ANY($3)",
        )
        .bind(instance)
        .bind(millis(lease_ms))
        .bind(live)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            // A paused session holds no sandbox (no live entry), but its replica serves it.
            "UPDATE sessions SET lease_until = now() + $2 * interval '1 millisecond' \
             WHERE instance = $1 AND status <> 'closed' AND (id = ANY($3) OR status = 'paused')",
        )
        .bind(instance)
        .bind(millis(lease_ms))
        .bind(live)
        .execute(&mut *tx)
        .await?;
        let lost = sqlx::query_scalar(
            "SELECT id FROM executions WHERE id = ANY($1) AND finished_at IS NOT NULL",
        )
        .bind(live)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(lost)
    }

    /// Every replica that ever registered, newest heartbeat first.
    pub async fn replicas(&self) -> Result<Vec<ReplicaRow>, AuditError> {
        Ok(
            sqlx::query_as("SELECT * FROM replicas ORDER BY heartbeat_at DESC LIMIT 64")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Closes, as `by`, the open records of other replicas whose lease expired (a record
    /// without a renewal yet counts from its creation): executions become `error`, sessions
    /// `closed` (`lease_expired`), each with an audit event in the same transaction. Rows
    /// another replica is closing at the same moment are skipped (`SKIP LOCKED`).
    pub async fn close_expired(&self, by: &str, lease_ms: u64) -> Result<Expired, AuditError> {
        let mut tx = self.pool.begin().await?;
        let executions: Vec<(String, String, String)> = sqlx::query_as(
            "UPDATE executions e SET status = 'error', finished_at = now(), \
             error = 'closed by ' || $1 || ': owner ' || e.instance || ' lease expired' \
             WHERE e.id IN (SELECT id FROM executions WHERE finished_at IS NULL \
             AND status IN ('queued', 'running') AND instance IS NOT NULL AND instance <> $1 \
             AND COALESCE(lease_until, created_at + $2 * interval '1 millisecond') < now() \
             FOR UPDATE SKIP LOCKED) RETURNING e.id, e.tenant, e.instance",
        )
        .bind(by)
        .bind(millis(lease_ms))
        .fetch_all(&mut *tx)
        .await?;
        for (id, tenant, owner) in &executions {
            let event = expired_event(api_types::EventKind::ExecutionReaped, id, tenant, by, owner);
            chain::append(&mut tx, &event).await?;
        }
        let sessions: Vec<(String, String, String)> = sqlx::query_as(
            "UPDATE sessions s SET status = 'closed', closed_reason = 'lease_expired', \
             closed_at = now() WHERE s.id IN (SELECT id FROM sessions WHERE status <> 'closed' \
             AND instance <> $1 \
             AND COALESCE(lease_until, created_at + $2 * interval '1 millisecond') < now() \
             FOR UPDATE SKIP LOCKED) RETURNING s.id, s.tenant, s.instance",
        )
        .bind(by)
        .bind(millis(lease_ms))
        .fetch_all(&mut *tx)
        .await?;
        for (id, tenant, owner) in &sessions {
            let mut event =
                expired_event(api_types::EventKind::SessionClosed, id, tenant, by, owner);
            event.execution_id = None;
            event.input = json!({"session_id": id, "owner": owner, "closed_by": by});
            chain::append(&mut tx, &event).await?;
        }
        tx.commit().await?;
        for _ in &executions {
            self.metrics.execution_finished(ExecutionStatus::Error);
        }
        Ok(Expired {
            executions: executions.len(),
            sessions: sessions.len(),
        })
    }

    /// Keeps an execution's collected output files, so any replica can serve them.
    pub async fn store_outputs(
        &self,
        execution_id: &str,
        files: &[(String, Vec<u8>)],
    ) -> Result<(), AuditError> {
        let (paths, contents): (Vec<&str>, Vec<&[u8]>) = files
            .iter()
            .map(|(path, content)| (path.as_str(), content.as_slice()))
            .unzip();
        sqlx::query(
            "INSERT INTO execution_outputs (execution_id, path, content) \
             SELECT $1, * FROM unnest($2::text[], $3::bytea[]) ON CONFLICT DO NOTHING",
        )
        .bind(execution_id)
        .bind(&paths)
        .bind(&contents)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// One stored output file of an execution.
    pub async fn output_content(
        &self,
        execution_id: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, AuditError> {
        Ok(sqlx::query_scalar(
            "SELECT content FROM execution_outputs WHERE execution_id = $1 AND path = $2",
        )
        .bind(execution_id)
        .bind(path)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The stored files of a policy revision (none when it was recorded without them).
    pub async fn policy_sources(
        &self,
        revision: &str,
    ) -> Result<Vec<policy_engine::SourceFile>, AuditError> {
        let files: Vec<(String, String)> = sqlx::query_as(
            "SELECT path, contents FROM policy_revision_files WHERE revision = $1 ORDER BY path",
        )
        .bind(revision)
        .fetch_all(&self.pool)
        .await?;
        Ok(files
            .into_iter()
            .map(|(path, contents)| policy_engine::SourceFile { path, contents })
            .collect())
    }

    /// Which of `ids` ran on `instance` and are purged (their files there are to go).
    pub async fn purged_among(
        &self,
        instance: &str,
        ids: &[String],
    ) -> Result<Vec<String>, AuditError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM executions WHERE id = ANY($2) AND instance = $1 \
             AND purged_at IS NOT NULL",
        )
        .bind(instance)
        .bind(ids)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Purged records of executions `instance` ran, in purge order after `after` (the last
    /// `(purged_at, id)` seen), `limit` at a time.
    pub async fn purged_since(
        &self,
        instance: &str,
        after: Option<&(DateTime<Utc>, String)>,
        limit: i64,
    ) -> Result<Vec<(DateTime<Utc>, String)>, AuditError> {
        let (at, id) = after.cloned().unzip();
        Ok(sqlx::query_as(
            "SELECT purged_at, id FROM executions WHERE instance = $1 AND purged_at IS NOT NULL \
             AND ($2::timestamptz IS NULL OR (purged_at, id) > ($2, $3)) \
             ORDER BY purged_at, id LIMIT $4",
        )
        .bind(instance)
        .bind(at)
        .bind(id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Sends `payload` to every replica listening on `channel` (`pg_notify`, delivered after
    /// this statement commits, in commit order; at most 8000 bytes).
    pub async fn notify(&self, channel: &str, payload: &str) -> Result<(), AuditError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A connection of its own that receives what is sent on `channels` (it reconnects and
    /// listens again by itself; what was sent meanwhile is lost).
    pub async fn listen(&self, channels: &[&str]) -> Result<PgListener, AuditError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all(channels.iter().copied()).await?;
        Ok(listener)
    }
}

fn expired_event(
    kind: api_types::EventKind,
    id: &str,
    tenant: &str,
    by: &str,
    owner: &str,
) -> NewEvent {
    let why = expired_reason(by, owner);
    NewEvent {
        kind,
        execution_id: Some(id.to_owned()),
        key_id: None,
        tenant: Some(tenant.to_owned()),
        decision_id: None,
        allow: None,
        reasons: events::reason("lease.expired", &why),
        input: events::column(&events::execution::Reaped::LeaseExpired {
            owner: owner.to_owned(),
            closed_by: by.to_owned(),
        }),
        decision: events::column(&events::execution::Closed {
            status: ExecutionStatus::Error,
        }),
        policy_revision: None,
    }
}
