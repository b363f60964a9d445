//! What an execution produced, after the fact: its output files (download), its live or stored
//! output as events, and the retention purge of both.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::executions::exit_summary;
use super::stream::{Stream, StreamEvent};
use super::{App, AppError};
use crate::audit::{events, ApiKey, ExecutionRow, NewEvent};
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
    /// Held for a reviewer: ask again with [`App::execution_events_after_review`], which
    /// waits for the decision (an approval then streams it, a rejection ends with its record).
    Pending,
}

/// A collected output file, ready to send.
#[derive(Debug)]
pub struct Download {
    pub body: DownloadBody,
    pub entry: OutputFile,
}

/// Where a download's bytes are: collected on this replica's disk, or (ran on another
/// replica) kept in the database.
#[derive(Debug)]
pub enum DownloadBody {
    File(std::fs::File),
    Stored(Vec<u8>),
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
        let local =
            tokio::task::spawn_blocking(move || crate::outputs::open_collected(&dir, &relative))
                .await
                .map_err(|err| AppError::Internal(err.to_string()))?;
        let body = match local {
            Ok(file) => DownloadBody::File(file),
            // Ran on another replica (or this disk lost it): the copy every replica shares.
            Err(err) => match self.audit.output_content(id, &entry.path).await? {
                Some(bytes) => DownloadBody::Stored(bytes),
                None => {
                    tracing::warn!(execution_id = %id, error = %err, "collected output missing");
                    return Err(AppError::NotFoundWhy(format!(
                        "output {path:?} of {id} is no longer stored"
                    )));
                }
            },
        };
        Ok(Download { body, entry })
    }

    /// The events of an execution: live if it runs here or on another replica (mirrored
    /// through the database, see `app::replicas`), else once its record is complete.
    pub async fn execution_events(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
    ) -> Result<EventSource, AppError> {
        self.events_source(caller, id, false).await
    }

    /// Like [`App::execution_events`] for an execution held for review: waits (at most the
    /// approval TTL) until a reviewer decides, then its live or stored events.
    pub async fn execution_events_after_review(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
    ) -> Result<EventSource, AppError> {
        self.events_source(caller, id, true).await
    }

    async fn events_source(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        wait_for_review: bool,
    ) -> Result<EventSource, AppError> {
        let review = Duration::from_secs(self.config.approval_ttl_s);
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.config.ceilings.timeout_ms)
            + Duration::from_secs(120)
            + if wait_for_review {
                review
            } else {
                Duration::ZERO
            };
        loop {
            let row = self.get_execution(caller, id).await?;
            if row.finished_at.is_some() {
                let layout = self.audit.stream_layout(id).await?;
                return Ok(EventSource::Stored(stored_events(&row, layout.as_ref())));
            }
            if let Some(stream) = self.streams.get(id) {
                return Ok(EventSource::Live(stream));
            }
            if runs_elsewhere(&row, &self.instance) {
                if let Some(mirror) = self.mirror_of(id).await {
                    return Ok(EventSource::Live(mirror));
                }
            }
            if row.is(crate::status::ExecutionStatus::PendingApproval) && !wait_for_review {
                return Ok(EventSource::Pending);
            }
            if tokio::time::Instant::now() > deadline {
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
            kind: api_types::EventKind::RetentionPurge,
            execution_id: None,
            key_id: None,
            tenant: None,
            decision_id: None,
            allow: Some(true),
            reasons: events::no_reasons(),
            input: events::column(&events::retention::Purge {
                retention_days: days,
                finished_before: cutoff,
                executions: ids.clone(),
            }),
            decision: events::column(&events::retention::Purged {
                purged: ["stdout", "stderr", "outputs"].map(str::to_owned).to_vec(),
            }),
            policy_revision: None,
        };
        self.audit.purge_payloads(&ids, &event).await?;
        // The files of what other replicas ran are on their disks: they remove them.
        self.announce_purge(&ids).await;
        Ok(ids.len())
    }
}

/// A finished record as the events a live follower would have seen.
/// The stored record as events: cut along the live stream's layout when there is one that
/// fits the stored text (so a replay is the live sequence, ids included), else each channel
/// whole.
fn stored_events(row: &ExecutionRow, layout: Option<&serde_json::Value>) -> Vec<StreamEvent> {
    let stdout = String::from_utf8_lossy(row.stdout.as_deref().unwrap_or_default());
    let stderr = String::from_utf8_lossy(row.stderr.as_deref().unwrap_or_default());
    let mut events = layout
        .and_then(|layout| cut_along(layout, &stdout, &stderr))
        .unwrap_or_else(|| {
            let mut whole = Vec::new();
            if !stdout.is_empty() {
                whole.push(StreamEvent::Stdout(stdout.clone().into_owned()));
            }
            if !stderr.is_empty() {
                whole.push(StreamEvent::Stderr(stderr.clone().into_owned()));
            }
            whole
        });
    events.push(StreamEvent::Exit(exit_summary(row)));
    events
}

/// `stdout` and `stderr` cut into the layout's runs; `None` unless the runs cover both texts
/// exactly, on character boundaries.
fn cut_along(layout: &serde_json::Value, stdout: &str, stderr: &str) -> Option<Vec<StreamEvent>> {
    let (mut out, mut err) = (stdout, stderr);
    let mut events = Vec::new();
    for run in layout.as_array()? {
        let bytes = usize::try_from(run[1].as_u64()?).ok()?;
        let rest = match run[0].as_str()? {
            "stdout" => &mut out,
            "stderr" => &mut err,
            _ => return None,
        };
        if !rest.is_char_boundary(bytes) {
            return None;
        }
        let (text, tail) = rest.split_at(bytes);
        *rest = tail;
        events.push(match run[0].as_str()? {
            "stdout" => StreamEvent::Stdout(text.to_owned()),
            _ => StreamEvent::Stderr(text.to_owned()),
        });
    }
    (out.is_empty() && err.is_empty()).then_some(events)
}

impl App {
    /// Keeps how the live stream of `id` split its output, before the record completes, so a
    /// replay after the end is the same sequence of events. Best effort: without it the replay
    /// sends each channel whole.
    pub(super) async fn save_stream_layout(&self, id: &str) {
        let Some(layout) = self.streams.get(id).and_then(|stream| stream.layout()) else {
            return;
        };
        if let Err(err) = self.audit.save_stream_layout(id, &layout).await {
            tracing::warn!(execution_id = %id, error = %err, "could not store the stream layout");
        }
    }
}

/// Whether `row` is queued or running on another replica than `instance`.
pub fn runs_elsewhere(row: &ExecutionRow, instance: &str) -> bool {
    row.finished_at.is_none()
        && (row.is(crate::status::ExecutionStatus::Queued)
            || row.is(crate::status::ExecutionStatus::Running))
        && row
            .instance
            .as_deref()
            .is_some_and(|owner| owner != instance)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stored_text_is_cut_along_the_layout_only_when_it_fits() {
        let layout = json!([["stdout", 3], ["stderr", 2], ["stdout", 4]]);
        assert_eq!(
            cut_along(&layout, "abcdéf", "xy"),
            Some(vec![
                StreamEvent::Stdout("abc".into()),
                StreamEvent::Stderr("xy".into()),
                StreamEvent::Stdout("déf".into()),
            ])
        );
        assert_eq!(
            cut_along(&layout, "abcdef", "xy"),
            None,
            "does not cover it"
        );
        let inside = json!([["stdout", 5], ["stdout", 1]]);
        assert_eq!(cut_along(&inside, "abcdéf", ""), None, "inside a character");
        assert_eq!(cut_along(&json!([["other", 1]]), "a", ""), None);
    }
}
