//! Tool calls run by this gateway itself (`POST /mcp`): `App::create_execution` (and the
//! session use cases) under the caller's key, the same use cases `POST /v1/executions` and the
//! session routes call, so policy, audit and tenant scoping are the same.

use std::io::Read;
use std::sync::Arc;

use serde_json::Value;

use super::{Refusal, Runner};
use crate::api::error::{ApiError, ErrorCode};
use crate::api::executions::ExecutionView;
use crate::app::executions::{Created, ExecutionRequest};
use crate::app::sessions::{Opened, SessionExecutionRequest, SessionRequest};
use crate::app::App;
use crate::audit::ApiKey;

/// The gateway's own use cases, as one authenticated caller.
pub struct Local {
    pub app: Arc<App>,
    pub caller: ApiKey,
}

impl Runner for Local {
    async fn run(&self, body: Value) -> Result<Value, Refusal> {
        let request: ExecutionRequest = serde_json::from_value(body)
            .map_err(|err| Refusal::new("invalid_request", err.to_string()))?;
        let created = self
            .app
            .create_execution(&self.caller, request)
            .await
            .map_err(|err| refusal(ApiError::from(err)))?;
        let view = |row| serde_json::to_value(ExecutionView::from(row));
        let record = match created {
            Created::Finished(row) | Created::Accepted(row) => view(row),
            Created::Denied(row) => {
                return Err(refusal(ApiError::policy_denied(row.id, row.reasons.0)))
            }
            Created::PendingApproval { row, approval_id } => view(row).map(|mut record| {
                record["approval_id"] = Value::String(approval_id);
                record
            }),
        };
        record.map_err(|err| Refusal::new("internal", format!("encoding the record: {err}")))
    }

    async fn open_session(&self, body: Value) -> Result<Value, Refusal> {
        let request: SessionRequest = serde_json::from_value(body).map_err(invalid)?;
        let opened = self.app.create_session(&self.caller, request).await;
        match opened.map_err(|err| refusal(ApiError::from(err)))? {
            Opened::Ready(row) | Opened::PendingApproval(row) => session_value(row),
            Opened::Denied(decision) => {
                let mut denied =
                    ApiError::new(ErrorCode::PolicyDenied, "the policy denied this session");
                denied.reasons = Some(decision.reasons);
                Err(refusal(denied))
            }
        }
    }

    async fn run_in_session(&self, id: &str, body: Value) -> Result<Value, Refusal> {
        let request: SessionExecutionRequest = serde_json::from_value(body).map_err(invalid)?;
        let row = self
            .app
            .create_session_execution(&self.caller, id, request)
            .await
            .map_err(|err| refusal(ApiError::from(err)))?;
        if !row.allow {
            return Err(refusal(ApiError::policy_denied(row.id, row.reasons.0)));
        }
        serde_json::to_value(ExecutionView::from(row))
            .map_err(|err| Refusal::new("internal", format!("encoding the record: {err}")))
    }

    async fn close_session(&self, id: &str) -> Result<Value, Refusal> {
        let row = self.app.delete_session(&self.caller, id).await;
        session_value(row.map_err(|err| refusal(ApiError::from(err)))?)
    }

    async fn download(&self, execution_id: &str, path: &str) -> Result<Vec<u8>, Refusal> {
        let download = self
            .app
            .output_file(&self.caller, execution_id, path)
            .await
            .map_err(|err| refusal(ApiError::from(err)))?;
        let mut file = match download.body {
            crate::app::payloads::DownloadBody::File(file) => file,
            crate::app::payloads::DownloadBody::Stored(bytes) => return Ok(bytes),
        };
        tokio::task::spawn_blocking(move || {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map(|_| bytes)
        })
        .await
        .map_err(|err| Refusal::new("internal", err.to_string()))?
        .map_err(|err| Refusal::new("unavailable", format!("reading the output file: {err}")))
    }
}

/// A `session_wire::SessionView` (or an API error) as the tool sees it.
fn session_value(row: crate::audit::sessions::SessionRow) -> Result<Value, Refusal> {
    let view = crate::api::sessions::view(row).map_err(refusal)?;
    serde_json::to_value(view)
        .map_err(|err| Refusal::new("internal", format!("encoding the session: {err}")))
}

fn invalid(err: serde_json::Error) -> Refusal {
    Refusal::new("invalid_request", err.to_string())
}

fn refusal(error: ApiError) -> Refusal {
    Refusal {
        code: serde_json::to_value(error.code)
            .ok()
            .and_then(|code| code.as_str().map(str::to_owned))
            .unwrap_or_else(|| "internal".to_owned()),
        message: error.message,
        reasons: error
            .reasons
            .unwrap_or_default()
            .into_iter()
            .filter_map(|reason| serde_json::to_value(reason).ok())
            .collect(),
        execution_id: error.execution_id,
    }
}
