//! What an execution produced, after the fact: its output files (download), its live or stored
//! output as events, and the retention purge of both.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;

use super::executions::exit_summary;
use super::stream::{Stream, StreamEvent};
use super::{App, AppError};
use crate::audit::{ApiKey, ExecutionRow, NewEvent};
use crate::outputs::OutputFile;

/// Most executions purged in one sweep (the next sweep takes the rest).
const PURGE_BATCH: i64 = 500;
/// How often a follower of an execution running elsewhere re-reads its record.
const POLL: Duration = Duration::from_millis(250);

/// Where the events of an execution come from.
#[derive(Debug)]
pub enum EventSource {
    /// Running here: replay, then follow.
    Live(Arc<Stream>),
    /// Finished: the stored record, as events.
    Stored(Vec<StreamEvent>),
}

/// A collected output file, ready to send.
#[derive(Debug)]
pub struct Download {
    pub file: std::fs::File,
    pub entry: OutputFile,
}

impl App {
    /// One output file of an execution the caller may see; only paths in its manifest.
    pub async fn output_file(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
    ) -> Result<Download, AppError> {
        let row = self.get_execution(caller, id).await?;
        if row.purged_at.is_some() {
            return Err(AppError::NotFoundWhy(format!(
                "the outputs of {id} were purged by retention"
            )));
        }
        let files: Vec<OutputFile> = serde_json::from_value(row.outputs.0.clone())
            .map_err(|err| AppError::Internal(format!("stored manifest of {id}: {err}")))?;
        let Some(entry) = files.into_iter().find(|file| file.path == path) else {
            return Err(AppError::NotFoundWhy(format!(
                "{id} has no output {path:?} (see its outputs and outputs_skipped)"
            )));
        };
        let dir = self.outputs_root.join(&row.id);
        let relative = entry.path.clone();
        let file =
            tokio::task::spawn_blocking(move || crate::outputs::open_collected(&dir, &relative))
                .await
                .map_err(|err| AppError::Internal(err.to_string()))?
                .map_err(|err| {
                    tracing::warn!(execution_id = %id, error = %err, "collected output missing");
                    AppError::NotFoundWhy(format!("output {path:?} of {id} is no longer stored"))
                })?;
        Ok(Download { file, entry })
    }

    /// The events of an execution: live if it runs here, else once its record is complete
    /// (an execution running on another gateway is followed by polling its record).
    pub async fn execution_events(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<EventSource, AppError> {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.config.ceilings.timeout_ms)
            + Duration::from_secs(120);
        loop {
            let row = self.get_execution(caller, id).await?;
            if row.finished_at.is_some() {
                return Ok(EventSource::Stored(stored_events(&row)));
            }
            if let Some(stream) = self.streams.get(id) {
                return Ok(EventSource::Live(stream));
            }
            if row.status == "pending_approval" || tokio::time::Instant::now() > deadline {
                return Err(AppError::Conflict(format!(
                    "execution {id} is {} and has no live output here",
                    row.status
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Purges stdout, stderr and output files of executions finished more than
    /// `retention_days` before `now`. Records, decisions and audit events stay (the chain is
    /// untouched); each purge is itself an audit event.
    pub async fn purge_payloads(&self, now: DateTime<Utc>) -> Result<usize, AppError> {
        let days = self.config.retention_days;
        if days == 0 {
            return Ok(0);
        }
        let cutoff = now - chrono::Duration::days(i64::from(days));
        let ids = self.audit.unpurged_before(cutoff, PURGE_BATCH).await?;
        if ids.is_empty() {
            return Ok(0);
        }
        // Only what is really gone is marked purged; the rest is tried again next sweep.
        let mut purged = Vec::with_capacity(ids.len());
        for id in ids {
            let dir = self.outputs_root.join(&id);
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => purged.push(id),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => purged.push(id),
                Err(err) => {
                    tracing::warn!(execution_id = %id, error = %err, "could not remove outputs");
                }
            }
        }
        if purged.is_empty() {
            return Ok(0);
        }
        let ids = purged;
        let event = NewEvent {
            kind: "retention.purge",
            execution_id: None,
            key_id: None,
            tenant: None,
            decision_id: None,
            allow: Some(true),
            reasons: json!([]),
            input: json!({"retention_days": days, "finished_before": cutoff, "executions": ids}),
            decision: json!({"purged": ["stdout", "stderr", "outputs"]}),
            policy_revision: None,
        };
        self.audit.purge_payloads(&ids, &event).await?;
        Ok(ids.len())
    }
}

/// A finished record as the events a live follower would have seen.
fn stored_events(row: &ExecutionRow) -> Vec<StreamEvent> {
    let mut events = Vec::new();
    let text = |bytes: &Vec<u8>| String::from_utf8_lossy(bytes).into_owned();
    if let Some(stdout) = row.stdout.as_ref().filter(|bytes| !bytes.is_empty()) {
        events.push(StreamEvent::Stdout(text(stdout)));
    }
    if let Some(stderr) = row.stderr.as_ref().filter(|bytes| !bytes.is_empty()) {
        events.push(StreamEvent::Stderr(text(stderr)));
    }
    events.push(StreamEvent::Exit(exit_summary(row)));
    events
}
