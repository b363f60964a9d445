//! Sessions held for review (`POST /v1/sessions` answering 202): the pending session
//! row and its approval (`approvals.session_id`), and every change of both, each committed in
//! one transaction with its audit events.
//!
//! A pending session belongs to no replica: its `instance` is [`UNOWNED`] and its lease never
//! lapses (`lease_until = 'infinity'`), since nothing of it runs anywhere; a restart does not
//! close it. Approving hands it to the deciding replica (its instance, a real lease) while that
//! replica starts the sandbox; a replica that dies meanwhile has its lease expire as usual.

use serde_json::json;

use policy_engine::Reason;

use super::approvals::{
    insert_approval, pending_cap_reached, ApprovalSubject, Held, NewApproval, PendingCaps, Verdict,
};
use super::sessions::{session_room, SessionRow, SessionsFull};
use super::{chain, AuditError, AuditStore, NewEvent};
use crate::metrics::DecisionOutcome;
use crate::session_wire::ClosedReason;

/// The `instance` of a session no replica holds (pending review).
pub const UNOWNED: &str = "";

type Tx<'a> = sqlx::Transaction<'a, sqlx::Postgres>;

impl AuditStore {
    /// Commits the pending session row, its approval and `events` in one transaction, unless the
    /// tenant or the key already has `caps` worth of pending approvals ([`Held::Full`]), or the
    /// tenant `max_sessions` sessions not closed, counted under its lock as for an open session
    /// (`Err(SessionsFull)`); then nothing is stored.
    pub async fn record_pending_session(
        &self,
        row: &SessionRow,
        approval: &NewApproval,
        events: &[NewEvent],
        (caps, max_sessions): (&PendingCaps, usize),
    ) -> Result<Result<Held, SessionsFull>, AuditError> {
        let mut tx = self.pool.begin().await?;
        if let Err(full) = session_room(&mut tx, &row.tenant, max_sessions).await? {
            return Ok(Err(full));
        }
        if let Some(full) = pending_cap_reached(&mut tx, &row.tenant, approval, caps).await? {
            return Ok(Ok(Held::Full(full)));
        }
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
        .execute(&mut *tx)
        .await?;
        let subject = ApprovalSubject::Session(&row.id);
        insert_approval(&mut tx, approval, subject, &row.tenant, row.created_at).await?;
        for event in events {
            chain::append(&mut tx, event).await?;
        }
        tx.commit().await?;
        self.metrics.decision(DecisionOutcome::RequireApproval);
        Ok(Ok(Held::Held))
    }

    /// Approves or rejects a pending, unexpired session approval of another key and principal.
    /// Approved: the session (still `pending_approval`) is handed to `verdict.instance` with a
    /// lease, to start it. Rejected: it is `closed` (`denied`). `events` are appended in the same
    /// transaction. `None`: nothing was pending to decide.
    pub async fn decide_session_approval(
        &self,
        id: &str,
        verdict: &Verdict<'_>,
        events: &[NewEvent],
    ) -> Result<Option<SessionRow>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let status = if verdict.approve {
            "approved"
        } else {
            "rejected"
        };
        let session: Option<String> = sqlx::query_scalar(
            "WITH old AS (SELECT id FROM approvals WHERE id = $1 AND status = 'pending' \
             AND session_id IS NOT NULL AND expires_at > now() FOR UPDATE) \
             UPDATE approvals a SET status = $2, decided_at = now(), reviewer_key_id = $3, \
             reviewer_principal = $4, comment = $5, request = NULL FROM old \
             WHERE a.id = old.id AND a.requester_key_id IS DISTINCT FROM $3 \
             AND sandgate_principal(a.requester_principal) IS DISTINCT FROM sandgate_principal($4) \
             RETURNING a.session_id",
        )
        .bind(id)
        .bind(status)
        .bind(verdict.reviewer_key_id)
        .bind(verdict.reviewer_principal)
        .bind(verdict.comment)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(session) = session else {
            return Ok(None);
        };
        let row: Option<SessionRow> = if verdict.approve {
            sqlx::query_as(
                "UPDATE sessions SET instance = $2, \
                 lease_until = now() + $3 * interval '1 millisecond' \
                 WHERE id = $1 AND status = 'pending_approval' RETURNING *",
            )
            .bind(&session)
            .bind(verdict.instance)
            .bind(verdict.lease_ms as f64)
            .fetch_optional(&mut *tx)
            .await?
        } else {
            close_pending(&mut tx, &session, ClosedReason::Denied).await?
        };
        if row.is_none() {
            // The approval and its session disagree: nothing is decided (rolled back).
            return Ok(None);
        }
        for event in events {
            chain::append(&mut tx, event).await?;
        }
        tx.commit().await?;
        Ok(row)
    }

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

    /// Withdraws the pending approval of `session_id` at its agent's request: the approval
    /// becomes `withdrawn` (payload cleared), the session `closed` (`deleted`), with
    /// `approval.withdrawn` (`event`) and `session.closed`, in one transaction. `None`: nothing
    /// was pending (decided, expired or withdrawn already).
    pub async fn withdraw_session_approval(
        &self,
        session_id: &str,
        reason: &Reason,
        event: &NewEvent,
    ) -> Result<Option<SessionRow>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let approval: Option<String> = sqlx::query_scalar(
            "UPDATE approvals SET status = 'withdrawn', decided_at = now(), request = NULL \
             WHERE session_id = $1 AND status = 'pending' RETURNING id",
        )
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(approval) = approval else {
            return Ok(None);
        };
        let mut event = event.clone();
        event.input = json!({
            "approval_id": approval,
            "session_id": session_id,
            "requested_by": event.key_id,
        });
        chain::append(&mut tx, &event).await?;
        let row = close_held(&mut tx, session_id, ClosedReason::Deleted, reason).await?;
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
        reasons: json!([why]),
        input: json!({"session_id": row.id, "approval_id": row.approval_id}),
        decision: json!({
            "closed_reason": row.closed_reason,
            "executions": row.executions,
            "created_at": row.created_at,
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
