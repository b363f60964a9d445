//! The error body every failure leaves as:
//! `{"error":{"code":"snake_case","message":"...","reasons":[...]?,"execution_id":"..."?}}`.

use serde::{Deserialize, Serialize};

use crate::policy::Reason;

/// What kind of failure an error answer is; each has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    Unauthenticated,
    Forbidden,
    PolicyDenied,
    NotFound,
    MethodNotAllowed,
    Conflict,
    PayloadTooLarge,
    RateLimited,
    Unavailable,
    Internal,
}

crate::text_forms::text_forms!(ErrorCode {
    InvalidRequest => "invalid_request",
    Unauthenticated => "unauthenticated",
    Forbidden => "forbidden",
    PolicyDenied => "policy_denied",
    NotFound => "not_found",
    MethodNotAllowed => "method_not_allowed",
    Conflict => "conflict",
    PayloadTooLarge => "payload_too_large",
    RateLimited => "rate_limited",
    Unavailable => "unavailable",
    Internal => "internal",
});

impl ErrorCode {
    /// The HTTP status an answer with this code has.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden | ErrorCode::PolicyDenied => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RateLimited => 429,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

/// Every error answer: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What went wrong and, where the caller can, what to change.
    pub message: String,
    /// The policy's reasons (`policy_denied`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<Reason>>,
    /// The execution the answer is about (`policy_denied`: its record exists, as `denied`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_spelt_as_their_text() {
        crate::text_forms::assert_serde_matches(ErrorCode::ALL, |code| code.as_str());
    }

    #[test]
    fn a_denial_parses_with_its_reasons() {
        let text = r#"{"error":{"code":"policy_denied","message":"the policy denied this execution","reasons":[{"code":"network.not_allowed","message":"example.org:443 is not allowed"}],"execution_id":"ex_1"}}"#;
        let body: ErrorBody = serde_json::from_str(text).unwrap();
        assert_eq!(body.error.code, ErrorCode::PolicyDenied);
        assert_eq!(body.error.code.http_status(), 403);
        assert_eq!(body.error.execution_id.as_deref(), Some("ex_1"));
        assert_eq!(
            body.error.reasons.as_ref().unwrap()[0].code,
            "network.not_allowed"
        );
        assert_eq!(serde_json::to_string(&body).unwrap(), text);
    }

    #[test]
    fn absent_reasons_stay_absent() {
        let text = r#"{"error":{"code":"not_found","message":"no such resource"}}"#;
        let body: ErrorBody = serde_json::from_str(text).unwrap();
        assert_eq!(body.error.reasons, None);
        assert_eq!(serde_json::to_string(&body).unwrap(), text);
        let unknown = r#"{"error":{"code":"teapot","message":"?"}}"#;
        assert!(serde_json::from_str::<ErrorBody>(unknown).is_err());
    }
}
