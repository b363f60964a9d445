//! `/v1/audit`: the auditors' views (auditor, admin): the events themselves and the chain check.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::listing::non_empty;
use super::query::{page_size, ApiQuery};
use crate::app::{App, AppError};
use crate::audit::read::{AuditEvent, EventFilter, KindFilter};
use crate::audit::verify::Verification;
use crate::role::Role;
use api_types::EventKind;

/// Page size when `limit` is absent.
pub const DEFAULT_LIMIT: u32 = 100;
/// Largest page; a bigger `limit` is lowered to it.
pub const MAX_LIMIT: u32 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    kind: Option<String>,
    execution_id: Option<String>,
    /// RFC 3339 time, or a duration back from now (`24h`, `7d`).
    since: Option<String>,
    limit: Option<u32>,
    /// The `seq` of the last event of the previous page.
    before: Option<i64>,
}

/// A page of audit events, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventPage {
    pub events: Vec<AuditEvent>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}

/// Audit events, newest first (`seq` descending), one bounded page at a time.
#[utoipa::path(
    get,
    path = "/v1/audit/events",
    tag = "audit",
    operation_id = "audit_events",
    summary = "Audit events, newest first.",
    security(("bearer" = ["auditor", "admin"])),
    params(
        ("kind" = Option<String>, Query),
        ("execution_id" = Option<String>, Query),
        ("since" = Option<String>, Query),
        ("limit" = Option<u32>, Query),
        ("before" = Option<i64>, Query),
    ),
    responses(
        (status = 200, description = "a page of events", body = EventPage),
        super::openapi::ApiErrors,
    ),
)]
pub async fn events(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<EventPage>, ApiError> {
    caller.require_role(&[Role::Auditor, Role::Admin])?;
    let limit = page_size(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let since = match non_empty(query.since) {
        Some(since) => Some(parse_since(&since)?),
        None => None,
    };
    let kind = match non_empty(query.kind) {
        Some(kind) => Some(KindFilter::parse(&kind).ok_or_else(|| unknown_kind(&kind))?),
        None => None,
    };
    let filter = EventFilter {
        kind,
        execution_id: non_empty(query.execution_id),
        since,
        before: query.before,
        limit,
    };
    let events = app
        .audit
        .list_events(&filter)
        .await
        .map_err(AppError::from)?;
    let next_before = (events.len() as i64 == limit)
        .then(|| events.last().map(|event| event.seq))
        .flatten();
    Ok(Json(EventPage {
        events,
        next_before,
    }))
}

/// 400 for a `kind` no event can have, listing the kinds and families that exist.
fn unknown_kind(kind: &str) -> ApiError {
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.as_str()).collect();
    let mut families: Vec<&str> = kinds
        .iter()
        .filter_map(|kind| kind.split_once('.').map(|(family, _)| family))
        .collect();
    families.dedup();
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!(
            "no event has kind {kind:?}: kind must be one of {}, or a family: {}",
            kinds.join(", "),
            families
                .iter()
                .map(|family| format!("{family}.*"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

pub(super) fn parse_since(text: &str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let invalid = || {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "since must be an RFC 3339 time or a duration like 24h or 7d",
        )
    };
    let window = crate::app::replay::parse_duration(text).map_err(|_| invalid())?;
    let window = chrono::Duration::from_std(window).map_err(|_| invalid())?;
    Utc::now().checked_sub_signed(window).ok_or_else(invalid)
}

/// Walks the hash chain; `broken` names the first event that does not verify.
#[utoipa::path(
    get,
    path = "/v1/audit/verify",
    tag = "audit",
    operation_id = "audit_verify",
    summary = "Walk the hash chain.",
    security(("bearer" = ["auditor", "admin"])),
    responses(
        (status = 200, description = "the verification", body = Verification),
        super::openapi::ApiErrors,
    ),
)]
pub async fn verify(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<Json<Verification>, ApiError> {
    caller.require_role(&[Role::Auditor, Role::Admin])?;
    let verification = app.audit.verify_chain().await.map_err(AppError::from)?;
    Ok(Json(verification))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_time_or_a_duration() {
        let at = parse_since("2026-11-30T01:02:03Z").unwrap();
        assert_eq!(at.to_rfc3339(), "2026-11-30T01:02:03+00:00");
        let day_ago = parse_since("24h").unwrap();
        let expected = Utc::now() - chrono::Duration::hours(24);
        assert!((day_ago - expected).num_seconds().abs() < 5);
        assert!(parse_since("yesterday").is_err());
        assert!(parse_since("9999999999999d").is_err());
    }
}
