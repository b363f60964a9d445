//! Authentication: `Authorization: Bearer <key>`, looked up by hash. Every failure is audited
//! before the 401 goes out; if it cannot be audited the answer is 503.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde_json::json;

use super::error::{ApiError, ErrorCode};
use crate::app::App;
use crate::audit::{claimed_key_id, ApiKey, NewEvent};

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
        let event = NewEvent {
            kind: "auth.failure",
            execution_id: None,
            key_id: None,
            tenant: None,
            decision_id: None,
            allow: Some(false),
            reasons: json!([{"code": format!("auth.{failure}"), "message": "authentication failed"}]),
            input: json!({
                "method": parts.method.as_str(),
                "path": parts.uri.path(),
                "claimed_key_id": secret.and_then(claimed_key_id),
            }),
            decision: json!({"allow": false}),
            policy_revision: None,
        };
        if let Err(err) = app.audit.record_event(&event).await {
            tracing::error!(error = %crate::app::error_chain(&err), "auditing an authentication failure failed");
            return Err(ApiError::unavailable());
        }
        Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "a valid API key is required: Authorization: Bearer <key>",
        ))
    }
}
