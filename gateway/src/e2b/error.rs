//! Refusals of the control plane in E2B's error shape (`{code, message}`, `code` the HTTP
//! status), with the status the SDKs map to the matching exception: 401
//! `AuthenticationException`, 404 `NotFoundException` / `SandboxNotFoundException` (or `False`
//! from `kill`), 429 `RateLimitException`, 503 `ServiceBusyException`, any other
//! `SandboxException("<status>: <message>")`. Every answer says `Should-Retry: false`: the SDKs
//! would otherwise replay a create on 429/502/503/504 and open a second sandbox.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::wire::ErrorBody;
use crate::app::AppError;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }

    pub fn not_found(sandbox_id: &str) -> E2bError {
        E2bError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {sandbox_id} not found"),
        )
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.status.as_u16(),
            message: self.message,
        };
        (self.status, [("should-retry", "false")], Json(body)).into_response()
    }
}

impl From<AppError> for E2bError {
    fn from(err: AppError) -> E2bError {
        let status = match &err {
            AppError::Invalid(_) | AppError::NoSuggestion(_) => StatusCode::BAD_REQUEST,
            AppError::NotFound | AppError::NotFoundWhy(_) => StatusCode::NOT_FOUND,
            AppError::Forbidden(_) => StatusCode::FORBIDDEN,
            AppError::Conflict(_) | AppError::RevisionConflict(_) => StatusCode::CONFLICT,
            AppError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            AppError::Unavailable(_) | AppError::ReplicaUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = match err {
            // Never the store's own words (they may name tables or hosts).
            AppError::Unavailable(_) => "the audit store is unavailable".to_owned(),
            AppError::Internal(_) => "internal error".to_owned(),
            other => other.to_string(),
        };
        E2bError::new(status, message)
    }
}
