//! Authentication: `Authorization: Bearer <key>`, looked up by hash. Failures are audited
//! before the 401 goes out, bounded (`app::refusals`: the first of each source's window as its
//! own event, the rest counted into one summary, 429 past the rate); if the first cannot be
//! audited the answer is 503.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde_json::json;

use super::error::{ApiError, ErrorCode};
use std::net::SocketAddr;

use axum::extract::ConnectInfo;

use crate::app::refusals::{bounded_text, Refusal, RefusalKind, Verdict};
use crate::app::App;
use crate::audit::{claimed_key_id, ApiKey};

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub ApiKey);

impl Caller {
    pub fn require_role(&self, roles: &[&str]) -> Result<(), ApiError> {
        if roles.contains(&self.0.role.as_str()) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("role {} may not do this", self.0.role),
        ))
    }
}

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let secret = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        let failure = match secret {
            None | Some("") => "missing_key",
            Some(secret) => match app.audit.find_key(secret).await {
                Ok(Some(key)) => return Ok(Caller(key)),
                Ok(None) => "unknown_key",
                Err(err) => {
                    tracing::error!(error = %crate::app::error_chain(&err), "key lookup failed");
                    return Err(ApiError::unavailable());
                }
            },
        };
        // Bounded: a row keeps at most MAX_TEXT bytes of the path (plus its length and hash),
        // repeats within a window become one summary event, and a flood gets 429.
        let refusal = Refusal {
            kind: RefusalKind::AuthFailure,
            source: parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip()),
            key_id: secret.and_then(claimed_key_id),
            tenant: None,
            code: format!("auth.{failure}"),
            detail: json!({
                "method": bounded_text(parts.method.as_str()),
                "path": bounded_text(parts.uri.path()),
            }),
        };
        match app.refuse(refusal).await {
            Ok(Verdict::Throttled { retry_after }) => return Err(ApiError::throttled(retry_after)),
            Ok(Verdict::Record | Verdict::Counted) => {}
            Err(err) => {
                tracing::error!(error = %crate::app::error_chain(&err), "auditing an authentication failure failed");
                return Err(ApiError::unavailable());
            }
        }
        Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "a valid API key is required: Authorization: Bearer <key>",
        ))
    }
}
