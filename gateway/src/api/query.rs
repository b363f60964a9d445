//! A query-string extractor whose rejections use the API error shape (400 `invalid_request`).

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};

#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => {
                let text = rejection.body_text();
                let detail = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text);
                Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("query string: {}", crate::plain::plain(detail)),
                ))
            }
        }
    }
}

/// A page size: `limit` if given (at least 1), `default` otherwise, never more than `max`.
pub fn page_size(limit: Option<u32>, default: u32, max: u32) -> Result<i64, ApiError> {
    match limit {
        Some(0) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "limit must be at least 1",
        )),
        Some(limit) => Ok(i64::from(limit.min(max))),
        None => Ok(i64::from(default)),
    }
}
