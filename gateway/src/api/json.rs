//! A JSON body extractor whose rejections use the API error shape: 413 when the body is over
//! the limit (checked while streaming), 400 for anything malformed.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};
use super::MAX_BODY_BYTES;

#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(reject(rejection)),
        }
    }
}

fn reject(rejection: JsonRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "request body is larger than the limit of {} MiB ({MAX_BODY_BYTES} bytes); \
                 send fewer or smaller files",
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        );
    }
    let text = rejection.body_text();
    let detail = text
        .strip_prefix("Failed to deserialize the JSON body into the target type: ")
        .map(|rest| format!("request body: {rest}"))
        .or_else(|| {
            text.strip_prefix("Failed to parse the request body as JSON: ")
                .map(|rest| format!("request body is not valid JSON: {rest}"))
        })
        .unwrap_or(text);
    ApiError::new(ErrorCode::InvalidRequest, crate::plain::plain(&detail))
}
