//! Tool calls run by this gateway itself (`POST /mcp`): `App::create_execution` (and the
//! session use cases) under the caller's key, the same use cases `POST /v1/executions` and the
//! session routes call, so policy, audit and tenant scoping are the same.

use std::io::Read;
use std::sync::Arc;

use api_types::{SessionExecutionRequest, SessionRequest, SessionView};

use crate::api::error::{ApiError, ErrorCode};
use crate::api::executions::ExecutionView;
use crate::app::executions::{Created, ExecutionRequest};
use crate::app::sessions::Opened;
use crate::app::App;
use crate::audit::ApiKey;
use crate::mcp::{Refusal, Runner};

/// The gateway's own use cases, as one authenticated caller.
pub struct Local {
    pub app: Arc<App>,
    pub caller: ApiKey,
}

impl Runner for Local {
    async fn run(&self, request: ExecutionRequest) -> Result<ExecutionView, Refusal> {
        let created = self
            .app
            .create_execution(&self.caller, request)
            .await
            .map_err(|err| refusal(ApiError::from(err)))?;
        match created {
            Created::Finished(row) | Created::Accepted(row) => Ok(ExecutionView::from(row)),
            Created::Denied(row) => Err(refusal(ApiError::policy_denied(row.id, row.reasons.0))),
            Created::PendingApproval { row, approval_id } => Ok(ExecutionView {
                approval_id: Some(approval_id),
                ..ExecutionView::from(row)
            }),
        }
    }

    async fn open_session(&self, request: SessionRequest) -> Result<SessionView, Refusal> {
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

    async fn run_in_session(
        &self,
        id: &str,
        request: SessionExecutionRequest,
    ) -> Result<ExecutionView, Refusal> {
        let row = self
            .app
            .create_session_execution(&self.caller, id, request)
            .await
            .map_err(|err| refusal(ApiError::from(err)))?;
        if !row.allow {
            return Err(refusal(ApiError::policy_denied(row.id, row.reasons.0)));
        }
        Ok(ExecutionView::from(row))
    }

    async fn close_session(&self, id: &str) -> Result<SessionView, Refusal> {
        let row = self.app.delete_session(&self.caller, id).await;
        session_value(row.map_err(|err| refusal(ApiError::from(err)))?)
    }

    async fn request_access(
        &self,
        id: &str,
        justification: &str,
    ) -> Result<api_types::AccessRequested, Refusal> {
        let asked = self
            .app
            .request_access(&self.caller, id, justification.to_owned());
        let row = asked.await.map_err(|err| refusal(ApiError::from(err)))?;
        Ok(api_types::AccessRequested {
            proposal_id: row.id,
            status: row.status,
        })
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
        .map_err(|err| Refusal::new(ErrorCode::Internal, err.to_string()))?
        .map_err(|err| {
            Refusal::new(
                ErrorCode::Unavailable,
                format!("reading the output file: {err}"),
            )
        })
    }
}

/// The session as the API shows it (or an API error).
fn session_value(row: crate::audit::sessions::SessionRow) -> Result<SessionView, Refusal> {
    crate::api::sessions::view(row).map_err(refusal)
}

fn refusal(error: ApiError) -> Refusal {
    Refusal {
        code: error.code,
        message: error.message,
        reasons: error.reasons.unwrap_or_default(),
        execution_id: error.execution_id,
    }
}
