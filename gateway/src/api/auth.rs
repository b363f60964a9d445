//! Authentication: `Authorization: Bearer <key>`, looked up by hash. Failures are audited
//! before the 401 goes out, bounded (`app::refusals`: the first of each source's window as its
//! own event, the rest counted into one summary, 429 past the rate); if the first cannot be
//! audited the answer is 503.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde_json::json;

use super::error::{ApiError, ErrorCode};
use crate::app::refusals::{bounded_text, Refusal, RefusalKind, Verdict};
use crate::app::App;
use crate::audit::{claimed_key_id, ApiKey, AuditError};
use crate::role::Role;

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub ApiKey);

impl Caller {
    pub fn require_role(&self, roles: &[Role]) -> Result<(), ApiError> {
        if self.0.is_any(roles) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "role {} may not call this route; it is open to the roles: {}",
                self.0.role,
                Role::names(roles)
            ),
        ))
    }
}

/// Why a request carried no usable key. Each has its own audit code and its own message, so
/// the caller learns what to fix; none says more than the key id the caller itself claimed.
/// (Revoked and expired keys add their variants here when keys get a lifetime.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header, or an empty one.
    Missing,
    /// A header that is not `Bearer sgk_<16 hex>_<64 hex>`.
    Malformed,
    /// Well formed, but no active key has this secret.
    Unknown,
}

impl AuthFailure {
    /// The audit reason code (`auth.missing_key`, ...).
    pub fn code(self) -> &'static str {
        match self {
            AuthFailure::Missing => "auth.missing_key",
            AuthFailure::Malformed => "auth.malformed_key",
            AuthFailure::Unknown => "auth.unknown_key",
        }
    }

    fn message(self, claimed: Option<&str>) -> String {
        match self {
            AuthFailure::Missing => {
                "no API key: send the header `Authorization: Bearer <key>`".to_owned()
            }
            AuthFailure::Malformed => "the API key is malformed: a key looks like \
                 `sgk_<16 hex digits>_<64 hex digits>`, sent as `Authorization: Bearer <key>`"
                .to_owned(),
            AuthFailure::Unknown => format!(
                "API key {} is not known to this gateway (mistyped, or from another \
                 gateway or database)",
                claimed.unwrap_or("?")
            ),
        }
    }
}

/// The secret of a well-formed `Authorization: Bearer sgk_..` header, or why there is none.
fn bearer_secret(parts: &Parts) -> Result<&str, AuthFailure> {
    let Some(value) = parts.headers.get(AUTHORIZATION) else {
        return Err(AuthFailure::Missing);
    };
    let value = value.to_str().map_err(|_| AuthFailure::Malformed)?.trim();
    if value.is_empty() {
        return Err(AuthFailure::Missing);
    }
    let secret = value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .ok_or(AuthFailure::Malformed)?;
    if secret.is_empty() {
        return Err(AuthFailure::Missing);
    }
    if !well_formed(secret) {
        return Err(AuthFailure::Malformed);
    }
    Ok(secret)
}

/// `sgk_<16 hex>_<64 hex>`, the only shape `create_key` hands out.
fn well_formed(secret: &str) -> bool {
    let hex =
        |part: &str, len: usize| part.len() == len && part.bytes().all(|b| b.is_ascii_hexdigit());
    match secret
        .strip_prefix("sgk_")
        .and_then(|rest| rest.split_once('_'))
    {
        Some((id, key)) => hex(id, 16) && hex(key, 64),
        None => false,
    }
}

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let secret = bearer_secret(parts);
        let failure = match secret {
            Err(failure) => failure,
            Ok(secret) => match app.audit.find_key(secret).await {
                Ok(Some(key)) => return Ok(Caller(key)),
                Ok(None) => AuthFailure::Unknown,
                // The key's stored role is none this version knows: logged and counted where
                // it was read (`audit::unknown_value`); the key is refused.
                Err(AuditError::UnknownValue(_)) => {
                    return Err(ApiError::new(ErrorCode::Internal, "internal error"));
                }
                Err(err) => {
                    tracing::error!(error = %crate::errors::error_chain(&err), "key lookup failed");
                    return Err(ApiError::unavailable());
                }
            },
        };
        // The key id the caller claims (even in a malformed key): enough to audit and to say
        // which key failed, nothing an attacker did not send.
        let claimed = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().strip_prefix("Bearer "))
            .and_then(|secret| claimed_key_id(secret.trim()));
        // Bounded: a row keeps at most MAX_TEXT bytes of the path (plus its length and hash),
        // repeats within a window become one summary event, and a flood gets 429.
        let refusal = Refusal {
            kind: RefusalKind::AuthFailure,
            source: parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip()),
            key_id: claimed.clone(),
            tenant: None,
            code: failure.code().to_owned(),
            detail: json!({
                "method": bounded_text(parts.method.as_str()),
                "path": bounded_text(parts.uri.path()),
            }),
        };
        match app.refuse(refusal).await {
            Ok(Verdict::Throttled { retry_after }) => return Err(ApiError::throttled(retry_after)),
            Ok(Verdict::Record | Verdict::Counted) => {}
            Err(err) => {
                tracing::error!(error = %crate::errors::error_chain(&err), "auditing an authentication failure failed");
                return Err(ApiError::unavailable());
            }
        }
        Err(ApiError::new(
            ErrorCode::Unauthenticated,
            failure.message(claimed.as_deref()),
        ))
    }
}
