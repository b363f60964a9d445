//! Overflow: requests the policy allowed but the gateway could not take (the queue or the tenant's share of it is full, or too much already waits for
//! review). The request is still recorded, so a 429 after an allow leaves a trace: the execution
//! row (`denied`, the policy's own answer kept in the decision event's `decision`) and its
//! `execution.decision` event, whose `allow` is false and whose reasons name the refusal.
//! Queue refusals are bounded like the other refusals anyone can cause in bulk
//! (`app::refusals`): per window and per tenant and key, the first is recorded in full; later
//! ones are counted into that window's `queue.refused.repeated` event.

use serde_json::json;

use policy_engine::Reason;

use super::refusals::{self, RefusalKind, Verdict};
use super::{App, AppError};
use crate::audit::{ExecutionRow, NewEvent};

/// Why an allowed request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No place in the queue (all of it, or the tenant's share).
    QueueFull,
    /// The tenant or key already has as many requests (or bytes) waiting for review as allowed.
    PendingApprovalLimit,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue.full",
            Refusal::PendingApprovalLimit => "approval.pending_limit",
        }
    }
}

impl App {
    /// Records `row` (not yet committed) as denied by `refusal`, with its decision event, and
    /// returns the 429 to answer. If even that cannot be recorded, the answer is 503.
    pub(super) async fn refuse_after_decision(
        &self,
        (mut row, mut event): (ExecutionRow, NewEvent),
        refusal: Refusal,
        why: String,
    ) -> AppError {
        if refusal == Refusal::QueueFull {
            match self.refusals.note(&refusals::Refusal {
                kind: RefusalKind::QueueFull,
                source: None,
                key_id: Some(row.key_id.clone()),
                tenant: Some(row.tenant.clone()),
                code: refusal.code().to_owned(),
                detail: json!({"language": refusals::bounded_text(&row.language)}),
            }) {
                Verdict::Record => {}
                Verdict::Counted => {
                    return AppError::RateLimited(format!(
                        "{why} (counted in this window's queue.refused.repeated audit event)"
                    ))
                }
                Verdict::Throttled { retry_after } => {
                    return AppError::RateLimited(format!(
                        "{why}; too many refused requests from this key: retry in {} s",
                        retry_after.as_secs().max(1)
                    ))
                }
            }
        }
        let reason = Reason {
            code: refusal.code().to_owned(),
            message: why.clone(),
        };
        row.status = crate::status::ExecutionStatus::Denied;
        row.allow = false;
        row.finished_at = Some(crate::ids::now_micros());
        row.reasons.0.push(reason);
        event.allow = Some(false);
        event.reasons = crate::audit::events::column(&row.reasons.0);
        if let Err(err) = self.audit.record_execution_decision(&row, &event).await {
            return err.into();
        }
        tracing::info!(execution_id = %row.id, code = refusal.code(), "allowed request refused");
        AppError::RateLimited(format!("{why} (recorded as execution {})", row.id))
    }
}
