//! Executions in a session: each one decided (`request.kind:
//! "session_execution"`, with `request.session`), recorded with its `session_id` before its
//! turn is handed over, run as one turn of the session's runner, its `/output` collected while
//! the sandbox lives (`outputs_live`), completed with its `result`; one at a time (409).

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use policy_engine::RequestedLimits;

use super::contexts::Taken;
use super::floor::Runnable;
use super::pipeline::{Ask, InSession, Outcome, Subject};
use super::reaper::LiveGuard;
use super::request::{ExecutionRequest, MAX_CODE_BYTES};
use super::sessions::{Held, SessionExecutionRequest};
use super::subjects::ExecutionRecord;
use super::{App, AppError};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, Completion, ExecutionRow};
use crate::outputs::Collected;
use crate::runtime::{Ending, Job, JobFile, SessionRunner, TurnEnding, TurnRan};
use crate::session_wire::{ClosedReason, SessionStatus};
use crate::status::ExecutionStatus;

impl App {
    /// One execution in a session: decided, recorded, run as a turn, completed. It runs as the
    /// gateway's own task: a caller that goes away does not cut a turn short (its record, its
    /// event stream and the session's state are finished all the same).
    /// With `wait: false` the answer is the record as the turn starts (or as it was denied).
    pub async fn create_session_execution(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        request: SessionExecutionRequest,
    ) -> Result<ExecutionRow, AppError> {
        if let Some(session) = self.session_relayed_or_taken(caller, id).await? {
            return self
                .relay_session_execution(caller, &session, request)
                .await;
        }
        let app = Arc::clone(self);
        let (caller, id) = (caller.clone(), id.to_owned());
        let (started, starting) = match request.wait {
            Some(false) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let ran = self
            .tasks
            .spawn(async move { app.session_execution(&caller, &id, request, started).await });
        if let Some(starting) = starting {
            if let Ok(row) = starting.await {
                return Ok(row);
            }
        }
        ran.await
            .map_err(|err| AppError::Internal(format!("the session execution failed: {err}")))?
    }

    async fn session_execution(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        request: SessionExecutionRequest,
        started: Option<tokio::sync::oneshot::Sender<ExecutionRow>>,
    ) -> Result<ExecutionRow, AppError> {
        let row = self.get_session(caller, id).await?;
        let open = self
            .sessions
            .get(id)
            .ok_or_else(|| closed_conflict(id, &row))?;
        // A paused session is restored first (DESIGN 15); its record says so.
        let resumed = self.resume_paused(&row).await?;
        let Ok(mut guard) = open.held.try_lock() else {
            return Err(AppError::Conflict(format!(
                "session {id} is busy: one execution at a time"
            )));
        };
        let Some(held) = guard.as_mut() else {
            return Err(closed_conflict(id, &row));
        };
        // A cell in an extra code context (`app::contexts`) runs there, taken out meanwhile.
        let context = match request.e2b.as_ref().and_then(|e2b| e2b.context.as_deref()) {
            Some(context) => Some(open.contexts.take(context)?),
            None => None,
        };
        let _ = self
            .audit
            .set_session_status(id, SessionStatus::Busy, false)
            .await;
        let mut context = context;
        let ran = self
            .run_in_session(caller, &row, held, request, (started, context.as_mut()))
            .await;
        if let Some(taken) = context {
            let ended = match &ran {
                Ok((record, _)) => context_ended(record),
                Err(_) => None,
            };
            open.contexts.put_back(taken, ended).await;
        }
        *open
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        let (record, closes) = match ran {
            Ok(ran) => ran,
            Err(err) => {
                let _ = self
                    .audit
                    .set_session_status(id, SessionStatus::Ready, false)
                    .await;
                return Err(err);
            }
        };
        let _ = self
            .audit
            .set_session_status(id, SessionStatus::Ready, record.allow)
            .await;
        drop(guard);
        if let Some(reason) = closes {
            self.close_session(id, reason).await;
        }
        Ok(self.said_resumed(record, resumed).await)
    }

    /// Decide (the pipeline, `request.kind` `session_execution`), record, run; says why the
    /// session must close, if it must.
    async fn run_in_session(
        self: &Arc<Self>,
        caller: &ApiKey,
        session_row: &SessionRow,
        held: &mut Held,
        request: SessionExecutionRequest,
        (started, mut context): (
            Option<tokio::sync::oneshot::Sender<ExecutionRow>>,
            Option<&mut Taken>,
        ),
    ) -> Result<(ExecutionRow, Option<ClosedReason>), AppError> {
        let session_id = session_row.id.as_str();
        let files = self.checked_uploads(caller, &request.files).await?;
        let e2b = request.e2b.clone();
        let language = match &context {
            Some(taken) => runner_language(taken.info.runner),
            None => held.language.as_str(),
        };
        let as_execution = as_execution(language, request)?;
        let ask = Ask {
            caller,
            subject: Subject::SessionExecution(InSession {
                row: session_row,
                executions: held.executions,
                owner: self.session_party(&session_row.key_id).await?,
                runnable: &held.runnable,
                e2b,
            }),
            request: &as_execution,
            files: &files,
            from_snapshot: None,
        };
        let (ExecutionRecord { row, event }, runnable) =
            match self.pipeline::<ExecutionRecord>(&ask).await? {
                Outcome::Denied(record) => return Ok((record.row, None)),
                // Never: a turn sent to review is denied (`pipeline::Subject::may_wait`).
                Outcome::Held((row, _)) => return Ok((row, None)),
                Outcome::Admitted(record, runnable) => (record, runnable),
            };
        let live = self.live.track(&row.id);
        self.audit.record_execution_decision(&row, &event).await?;
        held.executions += 1;
        let stream = self.streams.open(&row.id);
        if let Some(started) = started {
            let mut running = row.clone();
            running.status = ExecutionStatus::Running;
            let _ = started.send(running);
        }
        let running = crate::egress::Running::start(&self.session_cursors, session_id, &row.id);
        let program = (as_execution.code, files);
        let ran = self
            .run_turn(
                &row,
                (held, context.as_deref_mut()),
                program,
                (&live, stream),
                &runnable,
            )
            .await;
        drop(running);
        // A context's end is its own (`context_ended`); the session goes on.
        let closes = match context {
            Some(_) => None,
            None => closes(&ran),
        };
        let output = (
            held.home.output.dir().to_owned(),
            runnable.limits.output_bytes,
        );
        let stored = self.finish_turn(row, ran, output).await;
        drop(live);
        Ok((stored, closes))
    }

    /// Completes a turn's record: its `/output`, its `result`, its stream closed once the
    /// record it summarises is stored (as for any execution).
    async fn finish_turn(
        &self,
        row: ExecutionRow,
        ran: Result<TurnRan, crate::runtime::RuntimeError>,
        (output_dir, output_budget): (std::path::PathBuf, u64),
    ) -> ExecutionRow {
        let (result, rich) = match &ran {
            Ok(TurnRan {
                ending:
                    TurnEnding::Exited {
                        result, results, ..
                    },
                ..
            }) => (result.clone(), results.clone()),
            _ => (None, None),
        };
        let special_files = ran
            .as_ref()
            .map(|ran| ran.special_files.clone())
            .unwrap_or_default();
        let mut done = completion(ran);
        done.outputs = self
            .collect_session_output(output_dir, &row.id, output_budget)
            .await;
        self.save_stream_layout(&row.id).await;
        crate::outputs::add_special_files(&mut done.outputs, &special_files);
        let mut stored = self.complete_durably(row, done).await;
        if let Some(result) = result {
            if let Err(err) = self.audit.set_result(&stored.id, &result).await {
                tracing::warn!(execution_id = %stored.id, error = %err, "result not stored");
            }
            stored.result = Some(result);
        }
        if let Some(rich) = rich {
            let results = super::session_results::cell_results(rich, output_budget);
            if let Err(err) = self.audit.set_results(&stored.id, &results).await {
                tracing::warn!(execution_id = %stored.id, error = %err, "results not stored");
            }
            stored.results = Some(sqlx::types::Json(results));
        }
        // As for any execution: the stream ends once the record it summarises is stored.
        if let Some(stream) = self.streams.get(&stored.id) {
            stream.close(super::executions::exit_summary(&stored));
        }
        self.streams.remove(&stored.id);
        stored
    }

    /// `/output` as the execution left it, collected while the sandbox may still run
    /// (`outputs_live`: nothing the program can swap is followed).
    async fn collect_session_output(
        &self,
        src: std::path::PathBuf,
        execution_id: &str,
        budget: u64,
    ) -> Collected {
        let dest = self.outputs_root.join(execution_id);
        let collected = tokio::task::spawn_blocking(move || {
            crate::outputs_live::collect_live(&src, &dest, budget)
        })
        .await;
        match collected {
            Ok(Ok(collected)) => collected,
            Ok(Err(err)) => {
                tracing::error!(execution_id, error = %err, "collecting /output failed");
                Collected {
                    truncated: true,
                    skipped: vec![crate::outputs::Skipped {
                        path: String::new(),
                        bytes: None,
                        reason: "collection_failed".to_owned(),
                    }],
                    ..Collected::default()
                }
            }
            Err(err) => {
                tracing::error!(execution_id, error = %err, "collecting /output panicked");
                Collected {
                    truncated: true,
                    ..Collected::default()
                }
            }
        }
    }

    async fn run_turn(
        &self,
        row: &ExecutionRow,
        (held, context): (&mut Held, Option<&mut Taken>),
        (code, files): (String, Vec<(String, Vec<u8>)>),
        (live, stream): (&LiveGuard, Arc<super::stream::Stream>),
        runnable: &Runnable,
    ) -> Result<TurnRan, crate::runtime::RuntimeError> {
        let control = crate::runtime::RunControl {
            timeout: Duration::from_millis(runnable.limits.timeout_ms),
            output_cap: usize::try_from(runnable.limits.output_bytes).unwrap_or(usize::MAX),
            sink: Some(stream),
            cancel: live.cancel_token(),
        };
        if let Err(err) = self
            .audit
            .mark_running(
                &row.id,
                crate::ids::now_micros(),
                super::launch::Start::Warm,
                held.sandbox.name(),
            )
            .await
        {
            tracing::warn!(execution_id = %row.id, error = %err, "could not mark running");
        }
        match context {
            Some(taken) => {
                let language = runner_language(taken.info.runner);
                let job = turn_job(language, &row.id, code, files);
                taken.running.turn(job, control).await
            }
            None => {
                let job = turn_job(&held.language, &row.id, code, files);
                held.sandbox.turn(job, control).await
            }
        }
    }
}

pub(super) fn closed_conflict(id: &str, row: &SessionRow) -> AppError {
    if row.is(SessionStatus::PendingApproval) {
        // Held for review, or approved and starting: no sandbox runs code yet.
        return AppError::Conflict(format!(
            "session {id} awaits approval {}: nothing runs in it until a reviewer approves it",
            row.approval_id.as_deref().unwrap_or("(unknown)")
        ));
    }
    if !row.is(SessionStatus::Closed) {
        // Open in the store under this replica's name, but not held by this run of it: a
        // previous run left it, and the start-up sweep closes it (`gateway_restart`).
        return AppError::Conflict(format!(
            "session {id} was left open by a previous run of replica {}; it is being closed",
            row.instance
        ));
    }
    AppError::Conflict(format!(
        "session {id} is closed ({})",
        row.closed_reason
            .map_or("unknown reason", ClosedReason::as_str)
    ))
}

/// An execution in a session, asked in an execution's terms: the session's language, this
/// call's code, uploads and deadline (the rest is the session's).
pub(super) fn as_execution(
    language: &str,
    request: SessionExecutionRequest,
) -> Result<ExecutionRequest, AppError> {
    if request.code.len() > MAX_CODE_BYTES {
        return Err(AppError::Invalid(format!(
            "code is {} bytes; the limit is {MAX_CODE_BYTES}",
            request.code.len()
        )));
    }
    Ok(ExecutionRequest {
        language: language.to_owned(),
        code: request.code,
        files: request.files,
        network: Vec::new(),
        mounts: Vec::new(),
        limits: RequestedLimits {
            timeout_ms: request.limits.timeout_ms,
            ..RequestedLimits::default()
        },
        labels: Default::default(),
        wait: true,
    })
}

/// A turn: the cell under `/tmp/sandgate-cells/` (named by the execution), the uploads in
/// `/workspace`.
fn turn_job(
    language: &str,
    execution_id: &str,
    code: String,
    files: Vec<(String, Vec<u8>)>,
) -> Job<'static> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let ext = if language == "python" { "py" } else { "sh" };
    let cell = format!("/tmp/sandgate-cells/{execution_id}.{ext}");
    let mut job_files = vec![JobFile {
        path: cell.clone(),
        content_b64: b64.encode(code.as_bytes()).into(),
        mode: Some(0o644),
    }];
    job_files.extend(files.into_iter().map(|(name, content)| JobFile {
        path: format!("{}/{name}", crate::runtime::WORKSPACE),
        content_b64: b64.encode(content).into(),
        mode: Some(0o644),
    }));
    Job {
        argv: vec![cell],
        cwd: None,
        env: None,
        files: job_files,
        proxy: None,
        exit_nonce: None,
    }
}

/// A context's language (its cells' record and file).
fn runner_language(runner: SessionRunner) -> &'static str {
    match runner {
        SessionRunner::Python => "python",
        SessionRunner::Bash => "bash",
    }
}

/// Why a cell's ending ended its code context, if it did: a timeout or cancel ends a context
/// (its init cannot be interrupted from outside), as does its runner's death.
fn context_ended(record: &ExecutionRow) -> Option<String> {
    match record.status {
        ExecutionStatus::Succeeded | ExecutionStatus::Failed | ExecutionStatus::Denied => None,
        other => Some(format!("its cell {} ended it ({other})", record.id)),
    }
}

/// Why a turn's ending closes its session, if it does.
fn closes(ran: &Result<TurnRan, crate::runtime::RuntimeError>) -> Option<ClosedReason> {
    match ran {
        Ok(ran) if ran.ending.session_lives() => None,
        Ok(TurnRan {
            ending: TurnEnding::Ended(Ending::Oom { .. }),
            ..
        }) => Some(ClosedReason::Oom),
        _ => Some(ClosedReason::Crashed),
    }
}

/// The record's ending, from the turn's.
fn completion(ran: Result<TurnRan, crate::runtime::RuntimeError>) -> Completion {
    let mut done = Completion {
        status: ExecutionStatus::Error,
        exit_code: None,
        duration_ms: 0,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        error: None,
        outputs: Collected::default(),
    };
    let ran = match ran {
        Ok(ran) => ran,
        Err(err) => {
            done.error = Some(err.to_string());
            return done;
        }
    };
    let (status, exit_code) = match ran.ending {
        TurnEnding::Exited { code: 0, .. } => (ExecutionStatus::Succeeded, Some(0)),
        TurnEnding::Exited { code, .. } => (ExecutionStatus::Failed, Some(i32::from(code))),
        TurnEnding::TimedOut { .. } => (ExecutionStatus::Timeout, None),
        TurnEnding::Cancelled { .. } => (ExecutionStatus::Cancelled, None),
        TurnEnding::Ended(Ending::Oom { .. }) => (ExecutionStatus::Oom, None),
        TurnEnding::Ended(_) => (ExecutionStatus::Killed, None),
    };
    done.status = status;
    done.exit_code = exit_code;
    done.duration_ms = i64::try_from(ran.duration.as_millis()).unwrap_or(i64::MAX);
    done.stdout_truncated = ran.stdout.truncated;
    done.stderr_truncated = ran.stderr.truncated;
    done.stdout = ran.stdout.bytes;
    done.stderr = ran.stderr.bytes;
    done
}
