//! The `approvals` table: executions and sessions held for human review. Every change of an
//! approval and of its subject's row (the execution, or the session) commits together with its
//! audit events. An approval has exactly one subject: `execution_id` or `session_id`.
//!
//! A pending session belongs to no replica: its `instance` is [`UNOWNED`] and its lease never
//! lapses (`lease_until = 'infinity'`), since nothing of it runs anywhere; a restart does not
//! close it. Approving hands it to the deciding replica (its instance, a real lease) while that
//! replica starts the sandbox; a replica that dies meanwhile has its lease expire as usual.

use crate::ids::ApprovalId;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::types::Json;

use policy_engine::Reason;

use super::events::{self, approvals as approval_events, sessions as session_events};
use super::sessions::{session_room, SessionRow, SessionsFull};
use super::{chain, insert_execution, AuditError, AuditStore, ExecutionRow, NewEvent};
use crate::metrics::DecisionOutcome;
use crate::session_wire::ClosedReason;
use crate::status::ExecutionStatus;
use api_types::ApprovalStatus;

/// The `instance` of a session no replica holds (pending review).
pub const UNOWNED: &str = "";

type Tx<'a> = sqlx::Transaction<'a, sqlx::Postgres>;

/// An approval as stored, without the request payload (only a preview of the code).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApprovalRow {
    pub id: ApprovalId,
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

/// What deciding takes from the approval: the stored request, the runnable decision.
type Taken = (Option<Json<Value>>, Option<Json<Value>>);

/// Selected columns; the code preview is the first 8192 characters of the program.
pub(super) const COLUMNS: &str =
    "id, execution_id, session_id, status, tenant, requester_key_id, requester_principal, \
     created_at, expires_at, decided_at, reviewer_key_id, reviewer_principal, comment, reasons, \
     runnable, summary, left(request->>'code', 8192) AS code_preview";

/// A new approval, inserted with its subject's row.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub id: ApprovalId,
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
    /// Nothing was stored: the tenant already has `max_sessions` sessions not closed.
    SessionsFull(SessionsFull),
    /// Nothing was stored: the requesting key was revoked (or expired) after it authenticated
    /// this request and before the hold could commit.
    KeyNotLive,
}

/// A subject's row as held for review, inserted with its approval.
#[derive(Debug, Clone, Copy)]
pub enum Pending<'a> {
    /// `pending_approval`, counted in the pending caps.
    Execution(&'a ExecutionRow),
    /// `pending_approval`, counted in the pending caps and against `max_sessions` as for an
    /// open session.
    Session {
        row: &'a SessionRow,
        max_sessions: usize,
    },
}

/// What an approval holds: the execution or the session of that id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalSubject<'a> {
    Execution(&'a str),
    Session(&'a str),
}

impl ApprovalSubject<'_> {
    fn column(self) -> (&'static str, String) {
        match self {
            ApprovalSubject::Execution(id) => ("execution_id", id.to_owned()),
            ApprovalSubject::Session(id) => ("session_id", id.to_owned()),
        }
    }
}

impl ApprovalRow {
    /// What the approval holds; `None` for a row with neither (never written by the gateway).
    pub fn subject(&self) -> Option<ApprovalSubject<'_>> {
        match (&self.execution_id, &self.session_id) {
            (Some(id), None) => Some(ApprovalSubject::Execution(id)),
            (None, Some(id)) => Some(ApprovalSubject::Session(id)),
            _ => None,
        }
    }
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
    /// A session's row as it now is: handed to the deciding instance (approved, still
    /// `pending_approval` until its sandbox starts) or `closed` (`denied`). `None` for an
    /// execution.
    pub session: Option<SessionRow>,
}

/// What withdrawing took back: the approval, and a session's row as it was closed.
#[derive(Debug, Clone)]
pub struct Withdrawn {
    pub approval_id: ApprovalId,
    pub session: Option<SessionRow>,
}

impl AuditStore {
    /// Commits the subject's `pending_approval` row, its approval and `events` (the decision
    /// and `approval.requested`) in one transaction, unless the tenant or the requesting key
    /// already has `caps` worth of pending approvals ([`Held::Full`]), or, for a session, the
    /// tenant `max_sessions` sessions not closed, counted under its lock as for an open session
    /// ([`Held::SessionsFull`]); then nothing is stored. Nothing is held before this returns
    /// `Ok(Held::Held)`.
    pub async fn record_pending(
        &self,
        pending: Pending<'_>,
        approval: &NewApproval,
        events: &[NewEvent],
        caps: &PendingCaps,
    ) -> Result<Held, AuditError> {
        let started = std::time::Instant::now();
        let mut tx = self.pool.begin().await?;
        if !requester_live(&mut tx, &approval.requester_key_id).await? {
            return Ok(Held::KeyNotLive);
        }
        let (tenant, created_at) = match pending {
            Pending::Execution(row) => (&row.tenant, row.created_at),
            Pending::Session { row, max_sessions } => {
                if let Err(full) = session_room(&mut tx, &row.tenant, max_sessions).await? {
                    return Ok(Held::SessionsFull(full));
                }
                (&row.tenant, row.created_at)
            }
        };
        if let Some(full) = pending_cap_reached(&mut tx, tenant, approval, caps).await? {
            return Ok(Held::Full(full));
        }
        let subject = match pending {
            Pending::Execution(row) => {
                insert_execution(&mut tx, row).await?;
                ApprovalSubject::Execution(&row.id)
            }
            Pending::Session { row, .. } => {
                insert_pending_session(&mut tx, row, approval).await?;
                ApprovalSubject::Session(&row.id)
            }
        };
        insert_approval(&mut tx, approval, subject, tenant, created_at).await?;
        for event in events {
            chain::append(&mut tx, event).await?;
        }
        tx.commit().await?;
        if let Pending::Execution(_) = pending {
            self.metrics.audit_appended(started.elapsed());
        }
        self.metrics.decision(DecisionOutcome::RequireApproval);
        Ok(Held::Held)
    }

    pub async fn get_approval(&self, id: &ApprovalId) -> Result<Option<ApprovalRow>, AuditError> {
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

    /// Approves or rejects a pending, unexpired approval of `subject` by another key and
    /// principal, with its subject's row and `events`, in one transaction. An execution
    /// approved is `queued` on `verdict.instance`, rejected `denied`. A session approved is
    /// handed to `verdict.instance` with a lease, to start it (still `pending_approval`),
    /// rejected `closed` (`denied`). `None`: nothing was pending to decide.
    pub async fn decide_approval(
        &self,
        id: &ApprovalId,
        subject: ApprovalSubject<'_>,
        verdict: &Verdict<'_>,
        events: &[NewEvent],
    ) -> Result<Option<Decided>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let Some((request, runnable)) = take_pending(&mut tx, id, subject, verdict).await? else {
            return Ok(None);
        };
        let (mut denied, mut session) = (false, None);
        match subject {
            ApprovalSubject::Execution(execution_id) if verdict.approve => {
                queue_approved(&mut tx, execution_id, verdict).await?;
            }
            ApprovalSubject::Execution(execution_id) => {
                denied = deny_execution(&mut tx, execution_id, &verdict.reason).await?;
            }
            ApprovalSubject::Session(session_id) => {
                session = decide_session(&mut tx, session_id, verdict).await?;
                if session.is_none() {
                    // The approval and its session disagree: nothing is decided (rolled back).
                    return Ok(None);
                }
            }
        }
        for event in events {
            chain::append(&mut tx, event).await?;
        }
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
            session,
        }))
    }

    /// Withdraws the pending approval of `subject` at its agent's request: the approval becomes
    /// `withdrawn` (its payload cleared) and `event` is appended; an execution ends `cancelled`
    /// with `reason`, a session `closed` (`deleted`, with `session.closed`); in one transaction.
    /// `None`: nothing was pending (decided, expired, or withdrawn already).
    pub async fn withdraw_approval(
        &self,
        subject: ApprovalSubject<'_>,
        reason: &Reason,
        event: &NewEvent,
    ) -> Result<Option<Withdrawn>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let (column, subject_id) = subject.column();
        let approval: Option<ApprovalId> = sqlx::query_scalar(&format!(
            "UPDATE approvals SET status = 'withdrawn', decided_at = now(), request = NULL \
             WHERE {column} = $1 AND status = 'pending' RETURNING id"
        ))
        .bind(&subject_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(approval_id) = approval else {
            return Ok(None);
        };
        let mut event = event.clone();
        let session = match subject {
            ApprovalSubject::Execution(execution_id) => {
                cancel_execution(&mut tx, execution_id, reason).await?;
                event.input = events::column(&approval_events::ExecutionWithdrawal {
                    approval_id: approval_id.clone(),
                    requested_by: event.key_id.clone(),
                });
                chain::append(&mut tx, &event).await?;
                None
            }
            ApprovalSubject::Session(session_id) => {
                event.input = events::column(&approval_events::SessionWithdrawal {
                    approval_id: approval_id.clone(),
                    session_id: session_id.to_owned(),
                    requested_by: event.key_id.clone(),
                });
                chain::append(&mut tx, &event).await?;
                close_held(&mut tx, session_id, ClosedReason::Deleted, reason).await?
            }
        };
        tx.commit().await?;
        if let ApprovalSubject::Execution(_) = subject {
            self.metrics.execution_finished(ExecutionStatus::Cancelled);
        }
        Ok(Some(Withdrawn {
            approval_id,
            session,
        }))
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
                reasons: events::column(&[&reason]),
                input: events::column(&approval_events::Expiry {
                    approval_id: id.clone(),
                    session_id: session_id.clone(),
                    expires_at: *expires_at,
                }),
                decision: events::column(&approval_events::Status {
                    status: ApprovalStatus::Expired,
                }),
                policy_revision: None,
            };
            chain::append(&mut tx, &event).await?;
            if let Some(session_id) = session_id {
                let expired = crate::session_wire::ClosedReason::Expired;
                close_held(&mut tx, session_id, expired, &reason).await?;
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
    ApprovalId,
    Option<String>,
    Option<String>,
    Option<String>,
    DateTime<Utc>,
);

/// Inserts a `pending` approval of `subject` (created with it, at `created_at`).
async fn insert_approval(
    tx: &mut Tx<'_>,
    approval: &NewApproval,
    subject: ApprovalSubject<'_>,
    tenant: &str,
    created_at: DateTime<Utc>,
) -> Result<(), AuditError> {
    let (column, id) = subject.column();
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

/// Whether the requesting key is live, its row share-locked until the hold commits. A revocation
/// locks the row to update it and withdraws what is pending in the same transaction
/// (`key_withdrawals.rs`): whichever commits first, the other sees it, so no request is held
/// for a key revoked while the request was still being read (after its headers authenticated).
async fn requester_live(tx: &mut Tx<'_>, key_id: &str) -> Result<bool, AuditError> {
    let live: Option<bool> = sqlx::query_scalar(
        "SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) \
         FROM api_keys WHERE id = $1 FOR SHARE",
    )
    .bind(key_id)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(live == Some(true))
}

/// Takes the tenant's pending-cap lock and says which cap (if any) one more pending approval of
/// `approval.request_bytes` would pass. Expired but unswept approvals do not count.
async fn pending_cap_reached(
    tx: &mut Tx<'_>,
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
    tx: &mut Tx<'_>,
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

/// Marks the pending, unexpired approval `id` of `subject` decided by another key and
/// principal, its payload cleared. `None`: nothing was pending to decide.
async fn take_pending(
    tx: &mut Tx<'_>,
    id: &str,
    subject: ApprovalSubject<'_>,
    verdict: &Verdict<'_>,
) -> Result<Option<Taken>, AuditError> {
    let status = if verdict.approve {
        "approved"
    } else {
        "rejected"
    };
    let (column, subject_id) = subject.column();
    Ok(sqlx::query_as(&format!(
        "WITH old AS (SELECT id, request FROM approvals WHERE id = $1 AND status = 'pending' \
         AND {column} = $6 AND expires_at > now() FOR UPDATE) \
         UPDATE approvals a SET status = $2, decided_at = now(), reviewer_key_id = $3, \
         reviewer_principal = $4, comment = $5, request = NULL FROM old \
         WHERE a.id = old.id AND a.requester_key_id IS DISTINCT FROM $3 \
         AND sandgate_principal(a.requester_principal) IS DISTINCT FROM sandgate_principal($4) \
         RETURNING old.request, a.runnable"
    ))
    .bind(id)
    .bind(status)
    .bind(verdict.reviewer_key_id)
    .bind(verdict.reviewer_principal)
    .bind(verdict.comment)
    .bind(subject_id)
    .fetch_optional(&mut **tx)
    .await?)
}

/// An approved execution: `queued` on the deciding instance, under its lease. The reviewer's
/// approval joins the reasons, so the record says who let it run.
async fn queue_approved(
    tx: &mut Tx<'_>,
    execution_id: &str,
    verdict: &Verdict<'_>,
) -> Result<(), AuditError> {
    sqlx::query(
        "UPDATE executions SET status = 'queued', reasons = reasons || $2::jsonb, \
         instance = $3, lease_until = now() + $4 * interval '1 millisecond' \
         WHERE id = $1 AND status = 'pending_approval'",
    )
    .bind(execution_id)
    .bind(Json(json!([verdict.reason])))
    .bind(verdict.instance)
    .bind(verdict.lease_ms as f64)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A decided session: approved, handed to the deciding instance with a lease (still
/// `pending_approval` until its sandbox starts); rejected, `closed` (`denied`). `None`: it was
/// not pending.
async fn decide_session(
    tx: &mut Tx<'_>,
    session_id: &str,
    verdict: &Verdict<'_>,
) -> Result<Option<SessionRow>, AuditError> {
    if !verdict.approve {
        return close_pending(tx, session_id, ClosedReason::Denied).await;
    }
    Ok(sqlx::query_as(
        "UPDATE sessions SET instance = $2, \
         lease_until = now() + $3 * interval '1 millisecond' \
         WHERE id = $1 AND status = 'pending_approval' RETURNING *",
    )
    .bind(session_id)
    .bind(verdict.instance)
    .bind(verdict.lease_ms as f64)
    .fetch_optional(&mut **tx)
    .await?)
}

/// A withdrawn execution: `cancelled`, with `reason`; nothing ever ran.
async fn cancel_execution(
    tx: &mut Tx<'_>,
    execution_id: &str,
    reason: &Reason,
) -> Result<(), AuditError> {
    sqlx::query(
        "UPDATE executions SET status = 'cancelled', reasons = reasons || $2::jsonb, \
         finished_at = now() WHERE id = $1 AND status = 'pending_approval'",
    )
    .bind(execution_id)
    .bind(Json(json!([reason])))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Inserts a session held for review: no replica ([`UNOWNED`]), a lease that never lapses,
/// expiring with its approval.
async fn insert_pending_session(
    tx: &mut Tx<'_>,
    row: &SessionRow,
    approval: &NewApproval,
) -> Result<(), AuditError> {
    sqlx::query(
        "INSERT INTO sessions (id, tenant, key_id, language, status, decision, limits, \
         idle_timeout_s, ttl_s, instance, created_at, last_used_at, expires_at, \
         lease_until, approval_id) \
         VALUES ($1, $2, $3, $4, 'pending_approval', $5, $6, $7, $8, $9, $10, $10, $11, \
         'infinity', $12)",
    )
    .bind(&row.id)
    .bind(&row.tenant)
    .bind(&row.key_id)
    .bind(&row.language)
    .bind(&row.decision)
    .bind(&row.limits)
    .bind(row.idle_timeout_s)
    .bind(row.ttl_s)
    .bind(UNOWNED)
    .bind(row.created_at)
    .bind(approval.expires_at)
    .bind(&approval.id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl AuditStore {
    /// An approved session's sandbox started: `ready` in `container`, its idle and lifetime
    /// clocks starting now, and `event` (`session.created`), in one transaction. `None`: the
    /// session is no longer this instance's to open (closed meanwhile); nothing was recorded.
    pub async fn session_started(
        &self,
        id: &str,
        instance: &str,
        container: &str,
        event: &NewEvent,
    ) -> Result<Option<SessionRow>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<SessionRow> = sqlx::query_as(
            "UPDATE sessions SET status = 'ready', container = $3, last_used_at = now(), \
             expires_at = now() + ttl_s * interval '1 second' \
             WHERE id = $1 AND instance = $2 AND status = 'pending_approval' RETURNING *",
        )
        .bind(id)
        .bind(instance)
        .bind(container)
        .fetch_optional(&mut *tx)
        .await?;
        if row.is_some() {
            chain::append(&mut tx, event).await?;
            tx.commit().await?;
        }
        Ok(row)
    }

    /// Closes an approved session whose sandbox has not started (`start_failed` when it could
    /// not, `deleted` when its agent deleted it meanwhile), with `session.closed` saying why.
    /// `None`: it was no longer waiting for its sandbox.
    pub async fn close_unstarted_session(
        &self,
        id: &str,
        closed: ClosedReason,
        why: &Reason,
    ) -> Result<Option<SessionRow>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let row = close_held(&mut tx, id, closed, why).await?;
        tx.commit().await?;
        Ok(row)
    }
}

/// Closes a session that has no sandbox (pending, or approved and not started) with `closed`
/// and appends `session.closed` with `why`. `None`: it was not in that state.
pub(super) async fn close_held(
    tx: &mut Tx<'_>,
    session_id: &str,
    closed: ClosedReason,
    why: &Reason,
) -> Result<Option<SessionRow>, AuditError> {
    let Some(row) = close_pending(tx, session_id, closed).await? else {
        return Ok(None);
    };
    let event = NewEvent {
        kind: api_types::EventKind::SessionClosed,
        execution_id: None,
        key_id: Some(row.key_id.clone()),
        tenant: Some(row.tenant.clone()),
        decision_id: None,
        allow: None,
        reasons: events::column(&[why]),
        input: events::column(&session_events::HeldSession {
            session_id: row.id.clone(),
            approval_id: row.approval_id.clone(),
        }),
        decision: events::column(&session_events::HeldClosed {
            closed_reason: row.closed_reason,
            executions: row.executions,
            created_at: row.created_at,
        }),
        policy_revision: None,
    };
    chain::append(tx, &event).await?;
    Ok(Some(row))
}

async fn close_pending(
    tx: &mut Tx<'_>,
    session_id: &str,
    closed: ClosedReason,
) -> Result<Option<SessionRow>, AuditError> {
    Ok(sqlx::query_as(
        "UPDATE sessions SET status = 'closed', closed_reason = $2, closed_at = now() \
         WHERE id = $1 AND status = 'pending_approval' RETURNING *",
    )
    .bind(session_id)
    .bind(closed.as_str())
    .fetch_optional(&mut **tx)
    .await?)
}
