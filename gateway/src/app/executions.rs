//! The execution use case: decide -> audit (commit) -> run -> complete. This is the only path
//! to a sandbox, so no handler can run code without a committed decision.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::types::Json;

use policy_engine::{Decision, Environment, FileInput, PolicyInput, Principal, RequestInput};

use super::floor::Runnable;
use super::launch::{command_for, Launch, Program};
pub use super::request::{ExecutionRequest, FileUpload, MAX_CODE_BYTES};
use super::validate::check_fields;
use super::{App, AppError};
use crate::audit::{events, ApiKey, ExecutionRow, NewEvent};
use crate::role::Role;
use crate::status::ExecutionStatus;

/// How long (in 100 ms steps) a cancel request waits for the record to close.
const CANCEL_WAIT_STEPS: u32 = 100;

/// What became of a create request.
#[derive(Debug)]
pub enum Created {
    /// Ran to an end (any status): the final record.
    Finished(ExecutionRow),
    /// Runs in the background (`wait: false`).
    Accepted(ExecutionRow),
    Denied(ExecutionRow),
    /// Held for a reviewer (`pending_approval`); nothing runs until approved.
    PendingApproval {
        row: ExecutionRow,
        approval_id: String,
    },
}

impl App {
    pub async fn create_execution(
        self: &Arc<Self>,
        caller: &ApiKey,
        request: ExecutionRequest,
    ) -> Result<Created, AppError> {
        let files = self.checked_uploads(caller, &request.files).await?;
        check_fields(&request)?;
        let (_, program_path) = command_for(&request.language);
        if let Some((name, _)) = files
            .iter()
            .find(|(name, _)| program_path.strip_prefix("/workspace/") == Some(name.as_str()))
        {
            return Err(AppError::Invalid(format!(
                "file {name:?}: /workspace/{name} is where the program itself goes; upload it under another name"
            )));
        }
        if request.code.len() > MAX_CODE_BYTES {
            return Err(AppError::Invalid(format!(
                "code is {} bytes; the limit is {MAX_CODE_BYTES}",
                request.code.len()
            )));
        }
        let input = self.policy_input(caller, &request, &files);
        let policy = self.policy.current();
        let revision = policy.state.revision();
        // The audit row keeps what the policy said (replay compares against it); the
        // execution row and the event's allow/reasons say what the gateway then did.
        let said = policy.state.decide(&input);
        let mut decision = said.clone();
        let runnable = self.enforce_floor(&request.language, &mut decision);

        let row = new_row(
            caller,
            &request,
            &input,
            &decision,
            runnable.as_ref(),
            (revision, &self.instance),
        );
        // Tracked before the commit, so the reaper never closes it while it is in flight.
        let live = self.live.track(&row.id);
        let event = NewEvent {
            kind: api_types::EventKind::ExecutionDecision,
            execution_id: Some(row.id.clone()),
            key_id: Some(caller.id.clone()),
            tenant: Some(caller.tenant.clone()),
            decision_id: Some(row.decision_id.clone()),
            allow: Some(decision.allow),
            reasons: json!(decision.reasons),
            input: json!(input),
            decision: json!(said),
            policy_revision: Some(row.policy_revision.clone()),
        };
        // Sent to review: held (committed, fail closed), nothing runs until a reviewer approves.
        if let (Some(runnable), true) = (&runnable, decision.require_approval) {
            let held = (row, event);
            let (row, approval_id) = self
                .hold_for_review(caller, &request, &input, held, runnable)
                .await?;
            return Ok(Created::PendingApproval { row, approval_id });
        }
        // A place in the queue before anything runs: a full queue refuses (429), and the
        // refusal is recorded with the decision (app::overflow).
        let ticket = match &runnable {
            Some(_) => match self.scheduler.admit(&caller.tenant) {
                Ok(ticket) => Some(ticket),
                Err(full) => {
                    let refusal = super::overflow::Refusal::QueueFull;
                    let held = (row, event);
                    return Err(self
                        .refuse_after_decision(held, refusal, full.to_string())
                        .await);
                }
            },
            None => None,
        };
        // Fail closed: without a committed decision nothing runs.
        self.audit.record_execution_decision(&row, &event).await?;
        tracing::info!(execution_id = %row.id, allow = decision.allow, "decision recorded");

        let (Some(runnable), Some(ticket)) = (runnable, ticket) else {
            return Ok(Created::Denied(row));
        };
        let task = self.launch(Launch {
            row: row.clone(),
            program: Program {
                language: request.language,
                code: request.code,
                files,
            },
            runnable,
            live,
            ticket,
        });
        if !request.wait {
            return Ok(Created::Accepted(row));
        }
        task.await
            .map(Created::Finished)
            .map_err(|err| AppError::Internal(format!("execution task failed: {err}")))
    }

    pub async fn get_execution(&self, caller: &ApiKey, id: &str) -> Result<ExecutionRow, AppError> {
        match self.audit.get_execution(id).await? {
            Some(row) if caller.is_any(&Role::ACROSS_TENANTS) => Ok(row),
            Some(row) if row.tenant == caller.tenant => {
                // An execution run in a session is its owner's, as the session is.
                if let Some(session) = &row.session_id {
                    self.get_session(caller, session).await?;
                }
                Ok(row)
            }
            // Another tenant's execution is indistinguishable from a missing one, but audited
            // (bounded: `refusals`) as the probe it is.
            Some(row) => Err(self.cross_tenant_probe(caller, &row.id, &row.tenant).await),
            None => Err(AppError::NotFound),
        }
    }

    /// Stops a running execution (its sandbox is killed at once) and returns the final record;
    /// withdraws one held for review. Cancelling one that has finished is a conflict.
    pub async fn cancel_execution(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<ExecutionRow, AppError> {
        let row = self.get_execution(caller, id).await?;
        if row.finished_at.is_some() {
            return Err(AppError::Conflict(format!(
                "execution {id} has already finished ({})",
                row.status
            )));
        }
        // Held for review: the agent withdraws its request (audited); nothing ever ran.
        if row.is(crate::status::ExecutionStatus::PendingApproval) {
            return self.withdraw_request(caller, &row).await;
        }
        let elsewhere =
            super::payloads::runs_elsewhere(&row, &self.instance) && !self.live.contains(id);
        // Only what runs here or on another replica can be cancelled: anything else is
        // refused before it is recorded.
        if !self.live.contains(id) && !elsewhere {
            return Err(AppError::Conflict(format!(
                "execution {id} is {} and not running on any replica",
                row.status
            )));
        }
        let event = NewEvent {
            kind: api_types::EventKind::ExecutionCancel,
            execution_id: Some(id.to_owned()),
            key_id: Some(caller.id.clone()),
            // The execution's tenant: an admin of another tenant may cancel it.
            tenant: Some(row.tenant.clone()),
            decision_id: None,
            allow: Some(true),
            reasons: events::no_reasons(),
            input: events::column(&events::execution::Cancel {
                requested_by: caller.id.clone(),
                requested_by_tenant: caller.tenant.clone(),
            }),
            decision: events::column(&events::execution::Cancelled { cancel: true }),
            policy_revision: None,
        };
        self.audit.record_event(&event).await?;
        if elsewhere {
            self.cancel_elsewhere(id).await?;
        } else if !self.live.cancel(id) {
            return Err(AppError::Conflict(format!(
                "execution {id} is not running on this gateway"
            )));
        }
        for _ in 0..CANCEL_WAIT_STEPS {
            let row = self.get_execution(caller, id).await?;
            if row.finished_at.is_some() {
                return Ok(row);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.get_execution(caller, id).await
    }

    pub(super) fn policy_input(
        &self,
        caller: &ApiKey,
        request: &ExecutionRequest,
        files: &[(String, Vec<u8>)],
    ) -> PolicyInput {
        PolicyInput {
            principal: Principal {
                key_id: caller.id.clone(),
                tenant: caller.tenant.clone(),
                role: caller.role.as_str().to_owned(),
            },
            request: RequestInput {
                language: request.language.clone(),
                code_sha256: hex::encode(Sha256::digest(request.code.as_bytes())),
                code_bytes: request.code.len() as u64,
                files: files
                    .iter()
                    .map(|(path, content)| FileInput {
                        path: path.clone(),
                        bytes: content.len() as u64,
                    })
                    .collect(),
                network: request.network.clone(),
                mounts: request.mounts.clone(),
                limits: request.limits.clone(),
                labels: request.labels.clone(),
                kind: policy_engine::RequestKind::Execution,
                session: None,
                e2b: None,
            },
            environment: Environment {
                backends: self.config.backends.keys().cloned().collect(),
                datasets: self.config.datasets.keys().cloned().collect(),
                now: crate::ids::now_micros().to_rfc3339(),
            },
        }
    }
}

/// What the `exit` event of a stream carries: how the execution ended.
pub fn exit_summary(row: &ExecutionRow) -> serde_json::Value {
    let outputs = serde_json::from_value(row.outputs.0.clone()).unwrap_or_else(|err| {
        tracing::error!(execution_id = %row.id, error = %err, "outputs column unreadable");
        Vec::new()
    });
    json!(api_types::ExitEvent {
        status: row.status,
        exit_code: row.exit_code,
        duration_ms: row.duration_ms,
        stdout_truncated: row.stdout_truncated,
        stderr_truncated: row.stderr_truncated,
        outputs,
        outputs_truncated: row.outputs_truncated,
        stream_truncated: false,
    })
}

pub(super) fn new_row(
    caller: &ApiKey,
    request: &ExecutionRequest,
    input: &PolicyInput,
    decision: &Decision,
    runnable: Option<&Runnable>,
    (policy_revision, instance): (&str, &str),
) -> ExecutionRow {
    let now = crate::ids::now_micros();
    ExecutionRow {
        id: crate::ids::new("ex"),
        tenant: caller.tenant.clone(),
        key_id: caller.id.clone(),
        language: request.language.clone(),
        code_sha256: input.request.code_sha256.clone(),
        code_bytes: i64::try_from(request.code.len()).unwrap_or(i64::MAX),
        labels: Json(json!(request.labels)),
        status: if runnable.is_some() {
            ExecutionStatus::Queued
        } else {
            ExecutionStatus::Denied
        },
        decision_id: crate::ids::new("dc"),
        allow: decision.allow,
        reasons: Json(decision.reasons.clone()),
        backend: runnable.map(|r| r.backend.clone()),
        runtime: runnable.map(|r| r.runtime.clone()),
        image: runnable.map(|r| r.image.clone()),
        limits: runnable.map(|r| Json(r.limits.clone())),
        policy_revision: policy_revision.to_owned(),
        created_at: now,
        started_at: None,
        finished_at: runnable.is_none().then_some(now),
        exit_code: None,
        duration_ms: None,
        stdout: None,
        stderr: None,
        stdout_truncated: false,
        stderr_truncated: false,
        outputs: Json(json!([])),
        error: None,
        instance: Some(instance.to_owned()),
        outputs_skipped: Json(json!([])),
        outputs_truncated: false,
        purged_at: None,
        start: None,
        container: None,
        session_id: None,
        result: None,
    }
}
