//! Requests held for review whose key is revoked (issue 21, item 9): revoking a key (or rotating
//! it, which revokes the old one) withdraws every request of that key still waiting for a
//! reviewer, in the transaction that revokes it. A pending execution becomes `cancelled`, a
//! pending session `closed` (`deleted`); each approval becomes `withdrawn` (payload cleared)
//! with an `approval.withdrawn` event naming the revoked key (and `session.closed` for a
//! session). A reviewer can therefore never approve a revoked key's request: the approval is no
//! longer pending, so deciding it is a conflict.

use serde_json::json;
use sqlx::types::Json;
use sqlx::{Postgres, Transaction};

use policy_engine::Reason;

use super::approvals::close_held;
use super::events::{self, approvals as approval_events};
use super::keys::ApiKey;
use super::{chain, AuditError, NewEvent};
use crate::session_wire::ClosedReason;

/// One withdrawn approval: its id and its subject.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Withdrawn {
    pub id: String,
    pub execution_id: Option<String>,
    pub session_id: Option<String>,
    pub tenant: Option<String>,
}

/// Withdraws the pending approvals requested with key `key_id`, revoked in `tx` by `by` (`None`:
/// the command line). Returns what was withdrawn.
pub(super) async fn withdraw_pending_of(
    tx: &mut Transaction<'_, Postgres>,
    key_id: &str,
    by: Option<&ApiKey>,
) -> Result<Vec<Withdrawn>, AuditError> {
    let withdrawn: Vec<Withdrawn> = sqlx::query_as(
        "UPDATE approvals SET status = 'withdrawn', decided_at = now(), request = NULL \
         WHERE requester_key_id = $1 AND status = 'pending' \
         RETURNING id, execution_id, session_id, tenant",
    )
    .bind(key_id)
    .fetch_all(&mut **tx)
    .await?;
    let reason = Reason {
        code: "key.revoked".to_owned(),
        message: format!("withdrawn: the requesting key {key_id} was revoked before review"),
    };
    for approval in &withdrawn {
        chain::append(tx, &withdrawn_event(approval, key_id, by, &reason)).await?;
        if let Some(execution_id) = &approval.execution_id {
            sqlx::query(
                "UPDATE executions SET status = 'cancelled', reasons = reasons || $2::jsonb, \
                 finished_at = now() WHERE id = $1 AND status = 'pending_approval'",
            )
            .bind(execution_id)
            .bind(Json(json!([reason])))
            .execute(&mut **tx)
            .await?;
        }
        if let Some(session_id) = &approval.session_id {
            close_held(tx, session_id, ClosedReason::Deleted, &reason).await?;
        }
    }
    Ok(withdrawn)
}

/// `approval.withdrawn`, by the revoking key (none from the command line), naming the key whose
/// request it was.
fn withdrawn_event(
    approval: &Withdrawn,
    key_id: &str,
    by: Option<&ApiKey>,
    reason: &Reason,
) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::ApprovalWithdrawn,
        execution_id: approval.execution_id.clone(),
        key_id: by.map(|key| key.id.clone()),
        tenant: approval.tenant.clone(),
        decision_id: None,
        allow: Some(false),
        reasons: events::column(&[reason]),
        input: events::column(&approval_events::KeyWithdrawal {
            approval_id: approval.id.as_str().into(),
            session_id: approval.session_id.clone(),
            requested_by: key_id.to_owned(),
            via: if by.is_some() {
                approval_events::WithdrawnVia::KeyRevokedApi
            } else {
                approval_events::WithdrawnVia::KeyRevokedCommandLine
            },
        }),
        decision: events::column(&approval_events::Status {
            status: api_types::ApprovalStatus::Withdrawn,
        }),
        policy_revision: None,
    }
}
