//! The `approvals` table: executions and sessions held for human review. Every change of an
//! approval and of its execution (or session, `session_approvals.rs`) row commits together with
//! its audit event. An approval has exactly one subject: `execution_id` or `session_id`.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::types::Json;

use policy_engine::Reason;

use super::{chain, insert_execution, AuditError, AuditStore, ExecutionRow, NewEvent};
use crate::metrics::DecisionOutcome;
use crate::status::ExecutionStatus;
use api_types::ApprovalStatus;

/// An approval as stored, without the request payload (only a preview of the code).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApprovalRow {
    pub id: String,
    /// The execution held, or `None` for a session's approval.
    pub execution_id: Option<String>,
    /// The session held, or `None` for an execution's approval.
    pub session_id: Option<String>,
    pub status: ApprovalStatus,
    pub tenant: Option<String>,
    pub requester_key_id: Option<String>,
    pub requester_principal: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    pub reviewer_key_id: Option<String>,
    pub reviewer_principal: Option<String>,
    pub comment: Option<String>,
    pub reasons: Json<Vec<Reason>>,
    /// What will run once approved (backend, runtime, image, limits, mounts, network).
    pub runnable: Option<Json<Value>>,
    /// The policy input's request part: language, code hash, files and sizes, network, mounts.
    pub summary: Option<Json<Value>>,
    /// The first characters of the program, while the approval is pending.
    pub code_preview: Option<String>,
}

/// What deciding takes from the row: execution id, stored request, runnable decision.
type Taken = (String, Option<Json<Value>>, Option<Json<Value>>);

/// Selected columns; the code preview is the first 8192 characters of the program.
pub(super) const COLUMNS: &str =
    "id, execution_id, session_id, status, tenant, requester_key_id, requester_principal, \
     created_at, expires_at, decided_at, reviewer_key_id, reviewer_principal, comment, reasons, \
     runnable, summary, left(request->>'code', 8192) AS code_preview";

/// A new approval, inserted with its execution row.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub id: String,
    pub expires_at: DateTime<Utc>,
    pub requester_key_id: String,
    pub requester_principal: String,
    pub reasons: Vec<Reason>,
    pub runnable: Value,
    pub summary: Value,
    /// Language, code and files: what is needed to run it later. Cleared once decided.
    pub request: Value,
    /// Bytes `request` takes (its JSON), counted against the pending caps.
    pub request_bytes: i64,
}

/// How much may wait for review at once, per tenant and per requesting key.
#[derive(Debug, Clone, Copy)]
pub struct PendingCaps {
    pub per_tenant: i64,
    pub per_key: i64,
    pub bytes_per_tenant: i64,
    pub bytes_per_key: i64,
}

/// What holding a request for review did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    Held,
    /// Nothing was stored: a cap is reached (the message says which).
    Full(String),
}

/// Advisory lock class serialising the pending-cap check per tenant ("sgap" in ASCII); the
/// object id is the tenant's hash, so tenants do not wait on each other.
const PENDING_LOCK_CLASS: i32 = 0x7367_6170;

/// A decision taken on a pending approval.
#[derive(Debug, Clone)]
pub struct Verdict<'a> {
    pub approve: bool,
    pub reviewer_key_id: &'a str,
    pub reviewer_principal: &'a str,
    pub comment: Option<&'a str>,
    /// The gateway instance deciding: an approved execution runs there, so the row names it
    /// (another instance's reaper must not close it).
    pub instance: &'a str,
    /// The lease the deciding instance takes on an approved execution until its renewal.
    pub lease_ms: u64,
    /// Appended to the execution's reasons (`approval.approved` / `approval.rejected`).
    pub reason: Reason,
}

/// What deciding returned: the stored request (approve only) and the updated approval.
#[derive(Debug, Clone)]
pub struct Decided {
    pub approval: ApprovalRow,
    pub request: Option<Value>,
    pub runnable: Option<Value>,
}

impl AuditStore {
    /// Commits the execution row (`pending_approval`), its approval, the decision event and the
    /// `approval.requested` event in one transaction, unless the tenant or the requesting key
    /// already has `caps` worth of pending approvals (then nothing is stored: [`Held::Full`]).
    /// Nothing is held before this returns `Ok(Held::Held)`.
    pub async fn record_pending_execution(
        &self,
        row: &ExecutionRow,
        approval: &NewApproval,
        events: &[NewEvent],
        caps: &PendingCaps,
    ) -> Result<Held, AuditError> {
        let started = std::time::Instant::now();
        let mut tx = self.pool.begin().await?;
        if let Some(full) = pending_cap_reached(&mut tx, &row.tenant, approval, caps).await? {
            return Ok(Held::Full(full));
        }
        insert_execution(&mut tx, row).await?;
        let subject = ApprovalSubject::Execution(&row.id);
        insert_approval(&mut tx, approval, subject, &row.tenant, row.created_at).await?;
        for event in events {
            chain::append(&mut tx, event).await?;
        }
        tx.commit().await?;
        self.metrics.audit_appended(started.elapsed());
        self.metrics.decision(DecisionOutcome::RequireApproval);
        Ok(Held::Held)
    }

    pub async fn get_approval(&self, id: &str) -> Result<Option<ApprovalRow>, AuditError> {
        let row = sqlx::query_as(&format!("SELECT {COLUMNS} FROM approvals WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row)
    }

    /// Approvals, newest first, `limit` at a time; `status` filters, `tenant` restricts,
    /// `before` is the previous page's last approval id.
    pub async fn list_approvals(
        &self,
        status: Option<&str>,
        tenant: Option<&str>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ApprovalRow>, AuditError> {
        let rows = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM approvals WHERE ($1::text IS NULL OR status = $1) \
             AND ($2::text IS NULL OR tenant = $2) \
             AND ($3::text IS NULL OR (created_at, id) < \
                  (SELECT created_at, id FROM approvals WHERE id = $3)) \
             ORDER BY created_at DESC, id DESC LIMIT $4"
        ))
        .bind(status)
        .bind(tenant)
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Approves or rejects a pending, unexpired approval of another key and principal, with its
    /// execution row and audit event, in one transaction. `None`: nothing was pending to decide.
    pub async fn decide_approval(
        &self,
        id: &str,
        verdict: &Verdict<'_>,
        event: &NewEvent,
    ) -> Result<Option<Decided>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let status = if verdict.approve {
            "approved"
        } else {
            "rejected"
        };
        let taken: Option<Taken> = sqlx::query_as(
            "WITH old AS (SELECT id, request FROM approvals WHERE id = $1 AND status = 'pending' \
             AND expires_at > now() FOR UPDATE) \
             UPDATE approvals a SET status = $2, decided_at = now(), reviewer_key_id = $3, \
             reviewer_principal = $4, comment = $5, request = NULL FROM old \
             WHERE a.id = old.id AND a.requester_key_id IS DISTINCT FROM $3 \
             AND sandgate_principal(a.requester_principal) IS DISTINCT FROM sandgate_principal($4) \
             RETURNING a.execution_id, old.request, a.runnable",
        )
        .bind(id)
        .bind(status)
        .bind(verdict.reviewer_key_id)
        .bind(verdict.reviewer_principal)
        .bind(verdict.comment)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((execution_id, request, runnable)) = taken else {
            return Ok(None);
        };
        let denied = if verdict.approve {
            // The reviewer's approval joins the reasons, so the record says who let it run.
            sqlx::query(
                "UPDATE executions SET status = 'queued', reasons = reasons || $2::jsonb, \
                 instance = $3, lease_until = now() + $4 * interval '1 millisecond' \
                 WHERE id = $1 AND status = 'pending_approval'",
            )
            .bind(&execution_id)
            .bind(Json(json!([verdict.reason])))
            .bind(verdict.instance)
            .bind(verdict.lease_ms as f64)
            .execute(&mut *tx)
            .await?;
            false
        } else {
            deny_execution(&mut tx, &execution_id, &verdict.reason).await?
        };
        chain::append(&mut tx, event).await?;
        tx.commit().await?;
        if denied {
            self.metrics.execution_finished(ExecutionStatus::Denied);
        }
        let approval = self
            .get_approval(id)
            .await?
            .ok_or(AuditError::Unavailable(sqlx::Error::RowNotFound))?;
        Ok(Some(Decided {
            approval,
            request: if verdict.approve {
                request.map(|r| r.0)
            } else {
                None
            },
            runnable: runnable.map(|r| r.0),
        }))
    }

    /// Withdraws the pending approval of `execution_id` at its agent's request: the approval
    /// becomes `withdrawn` (its payload cleared), the execution `cancelled` with `reason`, and
    /// `event` is appended, in one transaction. `None`: nothing was pending (decided, expired,
    /// or withdrawn already).
    pub async fn withdraw_approval(
        &self,
        execution_id: &str,
        reason: &Reason,
        event: &NewEvent,
    ) -> Result<Option<String>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let approval: Option<String> = sqlx::query_scalar(
            "UPDATE approvals SET status = 'withdrawn', decided_at = now(), request = NULL \
             WHERE execution_id = $1 AND status = 'pending' RETURNING id",
        )
        .bind(execution_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(approval) = approval else {
            return Ok(None);
        };
        sqlx::query(
            "UPDATE executions SET status = 'cancelled', reasons = reasons || $2::jsonb, \
             finished_at = now() WHERE id = $1 AND status = 'pending_approval'",
        )
        .bind(execution_id)
        .bind(Json(json!([reason])))
        .execute(&mut *tx)
        .await?;
        let mut event = event.clone();
        event.input = json!({"approval_id": approval, "requested_by": event.key_id});
        chain::append(&mut tx, &event).await?;
        tx.commit().await?;
        self.metrics.execution_finished(ExecutionStatus::Cancelled);
        Ok(Some(approval))
    }

    /// Expires every pending approval past its `expires_at`: the approval becomes `expired`,
    /// its execution `denied` (reason `approval.expired`) or its session `closed` (`expired`,
    /// with `session.closed`), each with an `approval.expired` audit event, in one transaction.
    /// Returns the expired approvals.
    pub async fn expire_approvals(&self) -> Result<Vec<ApprovalRow>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let expired: Vec<Expired> = sqlx::query_as(
            "UPDATE approvals SET status = 'expired', decided_at = now(), request = NULL \
             WHERE id IN (SELECT id FROM approvals WHERE status = 'pending' \
             AND expires_at <= now() ORDER BY expires_at FOR UPDATE SKIP LOCKED) \
             RETURNING id, execution_id, session_id, tenant, expires_at",
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut denied = 0;
        for (id, execution_id, session_id, tenant, expires_at) in &expired {
            let reason = Reason {
                code: "approval.expired".to_owned(),
                message: format!("no reviewer decided before {}", expires_at.to_rfc3339()),
            };
            if let Some(execution_id) = execution_id {
                if deny_execution(&mut tx, execution_id, &reason).await? {
                    denied += 1;
                }
            }
            let event = NewEvent {
                kind: api_types::EventKind::ApprovalExpired,
                execution_id: execution_id.clone(),
                key_id: None,
                tenant: tenant.clone(),
                decision_id: None,
                allow: Some(false),
                reasons: json!([reason]),
                input: json!({"approval_id": id, "session_id": session_id, "expires_at": expires_at}),
                decision: json!({"status": "expired"}),
                policy_revision: None,
            };
            chain::append(&mut tx, &event).await?;
            if let Some(session_id) = session_id {
                let expired = crate::session_wire::ClosedReason::Expired;
                super::session_approvals::close_held(&mut tx, session_id, expired, &reason).await?;
            }
        }
        tx.commit().await?;
        for _ in 0..denied {
            self.metrics.execution_finished(ExecutionStatus::Denied);
        }
        let mut rows = Vec::with_capacity(expired.len());
        for (id, ..) in &expired {
            if let Some(row) = self.get_approval(id).await? {
                rows.push(row);
            }
        }
        Ok(rows)
    }
}

/// An approval the expiry sweep closed: id, execution, session, tenant, expiry.
type Expired = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    DateTime<Utc>,
);

/// Takes the tenant's pending-cap lock and says which cap (if any) one more pending approval of
/// `approval.request_bytes` would pass. Expired but unswept approvals do not count.
/// What a new approval holds: the row of the execution or of the session it is for.
#[derive(Debug, Clone, Copy)]
pub(super) enum ApprovalSubject<'a> {
    Execution(&'a str),
    Session(&'a str),
}

/// Inserts a `pending` approval of `subject` (created with it, at `created_at`).
pub(super) async fn insert_approval(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    approval: &NewApproval,
    subject: ApprovalSubject<'_>,
    tenant: &str,
    created_at: DateTime<Utc>,
) -> Result<(), AuditError> {
    let (column, id) = match subject {
        ApprovalSubject::Execution(id) => ("execution_id", id),
        ApprovalSubject::Session(id) => ("session_id", id),
    };
    sqlx::query(&format!(
        "INSERT INTO approvals (id, {column}, status, created_at, expires_at, tenant, \
         requester_key_id, requester_principal, reasons, runnable, summary, request, \
         request_bytes) \
         VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    ))
    .bind(&approval.id)
    .bind(id)
    .bind(created_at)
    .bind(approval.expires_at)
    .bind(tenant)
    .bind(&approval.requester_key_id)
    .bind(&approval.requester_principal)
    .bind(Json(&approval.reasons))
    .bind(Json(&approval.runnable))
    .bind(Json(&approval.summary))
    .bind(Json(&approval.request))
    .bind(approval.request_bytes)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn pending_cap_reached(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &str,
    approval: &NewApproval,
    caps: &PendingCaps,
) -> Result<Option<String>, AuditError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(PENDING_LOCK_CLASS)
        .bind(tenant)
        .execute(&mut **tx)
        .await?;
    let (tenant_count, tenant_bytes, key_count, key_bytes): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum(request_bytes), 0)::bigint, \
             count(*) FILTER (WHERE requester_key_id = $2), \
             COALESCE(sum(request_bytes) FILTER (WHERE requester_key_id = $2), 0)::bigint \
             FROM approvals WHERE status = 'pending' AND expires_at > now() AND tenant = $1",
    )
    .bind(tenant)
    .bind(&approval.requester_key_id)
    .fetch_one(&mut **tx)
    .await?;
    let bytes = approval.request_bytes;
    let full = if key_count >= caps.per_key {
        format!("this key already has {key_count} requests waiting for review (the limit)")
    } else if tenant_count >= caps.per_tenant {
        format!("this tenant already has {tenant_count} requests waiting for review (the limit)")
    } else if key_bytes.saturating_add(bytes) > caps.bytes_per_key {
        format!(
            "this key's requests waiting for review would hold {} bytes; the limit is {}",
            key_bytes.saturating_add(bytes),
            caps.bytes_per_key
        )
    } else if tenant_bytes.saturating_add(bytes) > caps.bytes_per_tenant {
        format!(
            "this tenant's requests waiting for review would hold {} bytes; the limit is {}",
            tenant_bytes.saturating_add(bytes),
            caps.bytes_per_tenant
        )
    } else {
        return Ok(None);
    };
    Ok(Some(full))
}

/// Ends a held execution as `denied`, adding `reason` to its reasons. `true`: it was held.
async fn deny_execution(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    execution_id: &str,
    reason: &Reason,
) -> Result<bool, AuditError> {
    let done = sqlx::query(
        "UPDATE executions SET status = 'denied', allow = false, \
         reasons = reasons || $2::jsonb, finished_at = now() \
         WHERE id = $1 AND status = 'pending_approval'",
    )
    .bind(execution_id)
    .bind(Json(json!([reason])))
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}
