//! `/v1/audit`: the auditors' checks.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use super::auth::Caller;
use super::error::ApiError;
use crate::app::{App, AppError};
use crate::audit::verify::Verification;

/// Walks the hash chain; `broken` names the first event that does not verify.
pub async fn verify(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> Result<Json<Verification>, ApiError> {
    caller.require_role(&["auditor", "admin"])?;
    let verification = app.audit.verify_chain().await.map_err(AppError::from)?;
    Ok(Json(verification))
}
