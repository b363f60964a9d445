//! The one error type of the HTTP edge. Every failure leaves as
//! `{"error":{"code":"snake_case","message":"...","reasons":[...]?}}`; no sqlx or bollard text
//! reaches a client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use policy_engine::Reason;

use crate::app::AppError;
use crate::audit::AuditError;

pub use api_types::{ErrorBody, ErrorCode, ErrorDetail};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub reasons: Option<Vec<Reason>>,
    pub execution_id: Option<String>,
    /// Sent as `retry-after` (seconds) with a 429.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            reasons: None,
            execution_id: None,
            retry_after: None,
        }
    }

    /// 429 with `retry-after`: too many refusals from this source or for this key.
    pub fn throttled(retry_after: std::time::Duration) -> ApiError {
        ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(
                ErrorCode::RateLimited,
                "too many refused requests from this address or for this key; try again later",
            )
        }
    }

    pub fn unavailable() -> ApiError {
        ApiError::new(
            ErrorCode::Unavailable,
            "the audit store is unavailable; nothing was run",
        )
    }

    pub fn policy_denied(execution_id: String, reasons: Vec<Reason>) -> ApiError {
        ApiError {
            code: ErrorCode::PolicyDenied,
            message: "the policy denied this execution".to_owned(),
            reasons: Some(reasons),
            execution_id: Some(execution_id),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                reasons: self.reasons,
                execution_id: self.execution_id,
            },
        };
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(body)).into_response();
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up: a client that waits that long is inside a new window.
            let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.max(1).into());
        }
        response
    }
}

impl From<AppError> for ApiError {
    fn from(err: AppError) -> ApiError {
        match err {
            AppError::Invalid(message) => ApiError::new(ErrorCode::InvalidRequest, message),
            AppError::NotFound => ApiError::new(ErrorCode::NotFound, "no such resource"),
            AppError::Forbidden(message) => ApiError::new(ErrorCode::Forbidden, message),
            AppError::NotFoundWhy(message) => ApiError::new(ErrorCode::NotFound, message),
            AppError::Conflict(message) => ApiError::new(ErrorCode::Conflict, message),
            AppError::RevisionConflict(message) => {
                ApiError::new(ErrorCode::RevisionConflict, message)
            }
            AppError::NoSuggestion(message) => ApiError::new(ErrorCode::NoSuggestion, message),
            AppError::RateLimited(message) => ApiError::new(
                ErrorCode::RateLimited,
                format!("{message}; try again later"),
            ),
            // Logged and counted where it was read (`audit::unknown_value`).
            AppError::Unavailable(AuditError::UnknownValue(_)) => {
                ApiError::new(ErrorCode::Internal, "internal error")
            }
            AppError::Unavailable(err) => {
                tracing::error!(error = %crate::errors::error_chain(&err), "audit store unavailable");
                ApiError::unavailable()
            }
            AppError::ReplicaUnavailable(message) => ApiError::new(ErrorCode::Unavailable, message),
            AppError::Internal(message) => {
                tracing::error!(error = %message, "internal error");
                ApiError::new(ErrorCode::Internal, "internal error")
            }
        }
    }
}
