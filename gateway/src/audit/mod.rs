//! The audit store (PostgreSQL through sqlx): API keys, policy revisions, executions and the
//! hash-chained `audit_events`. The only module that writes SQL.

pub mod approvals;
pub mod bundle;
pub mod chain;
pub mod charts;
pub mod durable;
pub mod e2b_sandboxes;
pub mod egress;
pub mod events;
pub mod group;
pub mod journal;
pub mod key_withdrawals;
pub mod keys;
pub mod pause_claims;
pub mod proposals;
pub mod read;
pub mod replicas;
pub mod review;
pub mod session_turns;
pub mod sessions;
pub mod snapshots;
pub mod unknown_value;
pub mod verify;

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::types::Json;
use sqlx::PgPool;

pub use chain::NewEvent;
use policy_engine::{Limits, Reason};

use crate::metrics::{DecisionOutcome, Metrics};
use crate::status::ExecutionStatus;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The store could not be reached or refused the write: callers must not act.
    #[error("audit store unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// The group-committed batch this write was in did not commit: no write of it is stored.
    #[error("audit store unavailable (the batch this write was in did not commit)")]
    Batch(#[source] Arc<sqlx::Error>),
    /// A row holds a value outside its closed set ([`unknown_value`]): it is not read.
    #[error("the store holds a value this version does not know")]
    UnknownValue(#[source] sqlx::Error),
    /// A key was asked for with a role that is none (callers parse roles first).
    #[error("not a role: {0:?}")]
    UnknownRole(String),
}

impl AuditError {
    /// The database error inside, as its own value (a batch's shared one is described).
    pub fn into_sqlx(self) -> sqlx::Error {
        match self {
            AuditError::Unavailable(err) | AuditError::UnknownValue(err) => err,
            AuditError::Batch(err) => sqlx::Error::Protocol(format!("audit batch failed: {err}")),
            AuditError::UnknownRole(role) => sqlx::Error::Protocol(format!("not a role: {role:?}")),
        }
    }
}

impl From<sqlx::Error> for AuditError {
    fn from(err: sqlx::Error) -> Self {
        match unknown_value::unknown_text(&err) {
            Some(unknown) => {
                unknown_value::note(unknown);
                AuditError::UnknownValue(err)
            }
            None => AuditError::Unavailable(err),
        }
    }
}

pub use keys::{ApiKey, NewKey};

/// One row of `executions`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExecutionRow {
    pub id: String,
    pub tenant: String,
    pub key_id: String,
    pub language: String,
    pub code_sha256: String,
    pub code_bytes: i64,
    pub labels: Json<Value>,
    pub status: ExecutionStatus,
    pub decision_id: String,
    pub allow: bool,
    pub reasons: Json<Vec<Reason>>,
    pub backend: Option<String>,
    pub runtime: Option<String>,
    pub image: Option<String>,
    pub limits: Option<Json<Limits>>,
    pub policy_revision: String,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<i64>,
    /// Exactly the bytes the program wrote (NUL and invalid UTF-8 included), up to the cap.
    pub stdout: Option<Vec<u8>>,
    pub stderr: Option<Vec<u8>>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub outputs: Json<Value>,
    pub error: Option<String>,
    /// The gateway instance that ran it.
    pub instance: Option<String>,
    pub outputs_skipped: Json<Value>,
    pub outputs_truncated: bool,
    /// When retention removed stdout, stderr and the output files.
    pub purged_at: Option<DateTime<Utc>>,
    /// `warm` (a pooled sandbox) or `cold`; unset until it runs.
    pub start: Option<api_types::ExecutionStart>,
    /// The container that ran it.
    pub container: Option<String>,
    /// The session it ran in.
    #[sqlx(default)]
    pub session_id: Option<String>,
    /// In a python session: the final expression's `repr`.
    #[sqlx(default)]
    pub result: Option<String>,
    /// In a python session: what the cell displayed (`app::session_results`).
    #[sqlx(default)]
    pub results: Option<Json<api_types::CellResults>>,
    /// Its session was paused and was restored to run it.
    #[sqlx(default)]
    pub resumed: bool,
}

impl ExecutionRow {
    /// Whether the record is in `status`.
    pub fn is(&self, status: ExecutionStatus) -> bool {
        self.status == status
    }
}

/// How an execution ended, written once the sandbox is gone (or journaled, see
/// [`journal`], when the database cannot take it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Completion {
    pub status: ExecutionStatus,
    pub exit_code: Option<i32>,
    pub duration_ms: i64,
    /// The program's bytes as they are: stored as `bytea`, journaled as base64.
    #[serde(with = "durable::base64_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "durable::base64_bytes")]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub error: Option<String>,
    pub outputs: crate::outputs::Collected,
}

#[derive(Debug, Clone)]
pub struct AuditStore {
    pool: PgPool,
    /// Where completions and connection closes go while the database is down (the server's
    /// store has one; the command line's does not need one).
    journal: Option<std::sync::Arc<journal::Journal>>,
    /// Counted here, when records commit, so the metrics say what the store holds.
    metrics: Arc<Metrics>,
    /// The group-commit queue of `record_event` and `record_execution_decision`.
    writer: Arc<group::GroupWriter>,
}

impl AuditStore {
    pub fn new(pool: PgPool) -> AuditStore {
        AuditStore::with_metrics(pool, Arc::default())
    }

    /// A store that counts what it commits in `metrics` (the server's; `new` keeps its own).
    pub fn with_metrics(pool: PgPool, metrics: Arc<Metrics>) -> AuditStore {
        AuditStore {
            pool,
            metrics,
            journal: None,
            writer: Arc::default(),
        }
    }

    /// Group-committed batches so far (each one transaction, one hold of the chain lock).
    pub fn batches_committed(&self) -> u64 {
        self.writer.batches()
    }

    /// Writes waiting for the writer to take them into a batch.
    pub fn writes_queued(&self) -> usize {
        self.writer.queued()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The same store, keeping what it cannot write in `journal` (see [`durable`]).
    pub fn with_journal(self, journal: std::sync::Arc<journal::Journal>) -> AuditStore {
        AuditStore {
            journal: Some(journal),
            ..self
        }
    }

    pub async fn ping(&self) -> Result<(), AuditError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn record_policy_revision(
        &self,
        revision: &str,
        files: &[String],
        loaded_by: &str,
    ) -> Result<(), AuditError> {
        sqlx::query(
            "INSERT INTO policy_revisions (revision, files, loaded_by) VALUES ($1, $2, $3) \
             ON CONFLICT (revision) DO NOTHING",
        )
        .bind(revision)
        .bind(Json(files))
        .bind(loaded_by)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Appends one event (decisions that have no execution row), group-committed: returns once
    /// the batch it landed in is committed.
    pub async fn record_event(&self, event: &NewEvent) -> Result<String, AuditError> {
        let started = Instant::now();
        let id = self
            .writer
            .submit(&self.pool, group::Write::Event(event.clone()))
            .await?;
        self.metrics.audit_appended(started.elapsed());
        Ok(id)
    }

    /// Commits the execution row and its decision event together (group-committed with other
    /// callers' writes). Nothing may run before this returns `Ok`.
    pub async fn record_execution_decision(
        &self,
        row: &ExecutionRow,
        event: &NewEvent,
    ) -> Result<(), AuditError> {
        let started = Instant::now();
        let write = group::Write::Decision(Box::new(row.clone()), event.clone());
        self.writer.submit(&self.pool, write).await?;
        self.metrics.audit_appended(started.elapsed());
        let outcome = if row.allow {
            DecisionOutcome::Allow
        } else {
            DecisionOutcome::Deny
        };
        self.metrics.decision(outcome);
        self.count_if_final(row.status);
        Ok(())
    }

    /// Counts a record that has reached a final status.
    fn count_if_final(&self, status: ExecutionStatus) {
        if status.is_final() {
            self.metrics.execution_finished(status);
        }
    }

    /// Finished executions whose payload is still stored, finished before `cutoff`.
    pub async fn unpurged_before(
        &self,
        cutoff: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<String>, AuditError> {
        let ids = sqlx::query_scalar(
            "SELECT id FROM executions WHERE purged_at IS NULL AND finished_at < $1 \
             ORDER BY finished_at LIMIT $2",
        )
        .bind(cutoff)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    /// Drops the payload (stdout, stderr) of `ids` and records the purge, in one transaction.
    /// The manifest (paths, sizes, hashes) stays as evidence of what existed.
    pub async fn purge_payloads(&self, ids: &[String], event: &NewEvent) -> Result<(), AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE executions SET stdout = NULL, stderr = NULL, results = NULL, purged_at = now() \
             WHERE id = ANY($1) AND purged_at IS NULL",
        )
        .bind(ids)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM execution_outputs WHERE execution_id = ANY($1)")
            .bind(ids)
            .execute(&mut *tx)
            .await?;
        chain::append(&mut tx, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The run began, in this container, started warm or cold.
    pub async fn mark_running(
        &self,
        id: &str,
        at: DateTime<Utc>,
        start: api_types::SandboxStart,
        container: &str,
    ) -> Result<(), AuditError> {
        sqlx::query(
            "UPDATE executions SET status = 'running', started_at = $2, start = $3, \
             container = $4 WHERE id = $1 AND finished_at IS NULL",
        )
        .bind(id)
        .bind(at)
        .bind(api_types::ExecutionStart(start))
        .bind(container)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Writes how an execution ended, as it happened at `finished_at` (a replay from the
    /// journal writes the time it really ended, not the time of the replay). A record already
    /// closed (another replica declared this one dead) stays as it is: `RowNotFound`. No column can
    /// refuse what a program wrote: output is `bytea`, and NUL is taken out of the error text.
    pub async fn complete_execution(
        &self,
        id: &str,
        done: &Completion,
        finished_at: DateTime<Utc>,
    ) -> Result<ExecutionRow, AuditError> {
        let updated: Option<ExecutionRow> = sqlx::query_as(
            "UPDATE executions SET status = $2, exit_code = $3, duration_ms = $4, stdout = $5, \
             stderr = $6, stdout_truncated = $7, stderr_truncated = $8, error = $9, \
             outputs = $10, outputs_skipped = $11, outputs_truncated = $12, \
             finished_at = $13 WHERE id = $1 AND finished_at IS NULL RETURNING *",
        )
        .bind(id)
        .bind(done.status)
        .bind(done.exit_code)
        .bind(done.duration_ms)
        .bind(&done.stdout)
        .bind(&done.stderr)
        .bind(done.stdout_truncated)
        .bind(done.stderr_truncated)
        .bind(done.error.as_deref().map(durable::without_nul))
        .bind(Json(&done.outputs.files))
        .bind(Json(&done.outputs.skipped))
        .bind(done.outputs.truncated)
        .bind(finished_at)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = updated else {
            // Closed already: another replica declared this one dead. Its record stays closed.
            let closed = self
                .get_execution(id)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            tracing::warn!(execution_id = %id, status = %closed.status, error = ?closed.error, "the record was closed while this gateway still ran it; its end is not written");
            return Ok(closed);
        };
        self.count_if_final(done.status);
        if let Ok(ms) = u64::try_from(done.duration_ms) {
            self.metrics
                .execution_ran(std::time::Duration::from_millis(ms));
        }
        Ok(row)
    }

    pub async fn get_execution(&self, id: &str) -> Result<Option<ExecutionRow>, AuditError> {
        let row = sqlx::query_as("SELECT * FROM executions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row)
    }

    /// Policy decisions recorded since `since`, oldest first: every execution's, and every
    /// session opening's (`session.created` / `session.denied` as decided, `approval.requested`
    /// of a session held for review; each keeps the policy input under `input.request`).
    pub async fn execution_decisions_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<StoredDecision>, AuditError> {
        let rows = sqlx::query_as(
            "SELECT execution_id, session_id, at, input, decision FROM ( \
               SELECT seq, execution_id, NULL::text AS session_id, at, input, decision \
               FROM audit_events WHERE kind = 'execution.decision' AND at >= $1 \
               UNION ALL \
               SELECT seq, NULL, input->>'session_id', at, input->'request', \
               coalesce(decision->'policy', decision) FROM audit_events \
               WHERE kind IN ('session.created', 'session.denied', 'approval.requested') \
               AND at >= $1 AND input ? 'session_id' AND input ? 'request') AS d \
             ORDER BY seq",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Marks `error` the executions of `instance` left open (queued or running) that are not in
    /// `live`, each with an `execution.reaped` audit event in the same transaction. Returns how
    /// many. `pending_approval` records are never closed here: they wait for a reviewer or
    /// their expiry (`app::approvals`), whatever happens to the gateway meanwhile.
    /// Closes this instance's `queued`/`running` records that `is_live` says nothing runs any
    /// more, as `error` with `why`, each with an `execution.reaped` event. Liveness is asked
    /// about rows already locked here, so a run that starts meanwhile is never closed (it is
    /// tracked before its row is committed, so a row seen here is tracked unless it ended).
    pub async fn close_abandoned(
        &self,
        instance: &str,
        is_live: impl Fn(&str) -> bool,
        why: &str,
    ) -> Result<u64, AuditError> {
        let mut tx = self.pool.begin().await?;
        let candidates: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM executions WHERE instance = $1 AND finished_at IS NULL \
             AND status IN ('queued', 'running') FOR UPDATE SKIP LOCKED",
        )
        .bind(instance)
        .fetch_all(&mut *tx)
        .await?;
        let abandoned: Vec<String> = candidates.into_iter().filter(|id| !is_live(id)).collect();
        let closed: Vec<(String, String)> = sqlx::query_as(
            "UPDATE executions SET status = 'error', error = $2, finished_at = now() \
             WHERE id = ANY($1) RETURNING id, tenant",
        )
        .bind(&abandoned)
        .bind(why)
        .fetch_all(&mut *tx)
        .await?;
        for (id, tenant) in &closed {
            let event = NewEvent {
                kind: api_types::EventKind::ExecutionReaped,
                execution_id: Some(id.clone()),
                key_id: None,
                tenant: Some(tenant.clone()),
                decision_id: None,
                allow: None,
                reasons: events::reason("execution.abandoned", why),
                input: events::column(&events::execution::Reaped::Abandoned {
                    instance: instance.to_owned(),
                }),
                decision: events::column(&events::execution::Closed {
                    status: ExecutionStatus::Error,
                }),
                policy_revision: None,
            };
            chain::append(&mut tx, &event).await?;
        }
        tx.commit().await?;
        for _ in &closed {
            self.metrics.execution_finished(ExecutionStatus::Error);
        }
        Ok(closed.len() as u64)
    }

    pub async fn events_for_execution(&self, id: &str) -> Result<Vec<EventRow>, AuditError> {
        let rows = sqlx::query_as(
            "SELECT seq, id, kind, allow, reasons, policy_revision, hash FROM audit_events \
             WHERE execution_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }
}

/// A past execution decision: what was asked and what the policy said.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredDecision {
    pub execution_id: Option<String>,
    /// Set for a session opening's decision.
    pub session_id: Option<String>,
    pub at: DateTime<Utc>,
    pub input: Value,
    pub decision: Value,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub seq: i64,
    pub id: String,
    pub kind: String,
    pub allow: Option<bool>,
    pub reasons: Json<Value>,
    pub policy_revision: Option<String>,
    pub hash: String,
}

/// Inserts an execution row inside the caller's transaction (with its decision event).
pub(crate) async fn insert_execution(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    row: &ExecutionRow,
) -> Result<(), AuditError> {
    sqlx::query(
        "INSERT INTO executions (id, tenant, key_id, language, code_sha256, code_bytes, \
             labels, status, decision_id, allow, reasons, backend, runtime, image, limits, \
             policy_revision, created_at, finished_at, instance, session_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20)",
    )
    .bind(&row.id)
    .bind(&row.tenant)
    .bind(&row.key_id)
    .bind(&row.language)
    .bind(&row.code_sha256)
    .bind(row.code_bytes)
    .bind(&row.labels)
    .bind(row.status)
    .bind(&row.decision_id)
    .bind(row.allow)
    .bind(&row.reasons)
    .bind(&row.backend)
    .bind(&row.runtime)
    .bind(&row.image)
    .bind(&row.limits)
    .bind(&row.policy_revision)
    .bind(row.created_at)
    .bind(row.finished_at)
    .bind(&row.instance)
    .bind(&row.session_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub fn key_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The key id a presented secret claims (`sgk_<id>_<secret>`), for audit rows about failures.
/// Never trusted for anything else.
pub fn claimed_key_id(secret: &str) -> Option<String> {
    let rest = secret.strip_prefix("sgk_")?;
    let (id, _) = rest.split_once('_')?;
    (id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("key_{id}"))
}
