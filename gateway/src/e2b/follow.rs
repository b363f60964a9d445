//! Following a command's session execution as `process.Process` events: the start event, then
//! its output as the runtime keeps it (the execution's live [`Stream`], the same capped bytes
//! its record stores), keepalives while it is quiet, and its end once the record is complete.
//! `Start` and `Connect` answer with the same events; a `Connect` replays what the command
//! printed so far, then follows.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::mpsc::Sender;

use super::connect::{end_stream, message, Code, ConnectError, EndEvent, ProcessEvent};
use super::envd::Reached;
use crate::app::stream::{Stream, StreamEvent};
use crate::app::App;
use crate::audit::ExecutionRow;
use crate::status::ExecutionStatus;

/// How often a finished command's record is looked at until it is complete.
const POLL: Duration = Duration::from_millis(50);
/// Largest data event taken from a stored record (E2B's envd sends small chunks too).
const CHUNK: usize = 64 * 1024;

/// Where a follower sends its events, and how often it keeps the stream alive.
pub(super) struct Events<'a> {
    pub(super) tx: &'a Sender<Bytes>,
    pub(super) keepalive: Option<Duration>,
    /// The process runs on a terminal: its output (and sandgate's notes) are `pty` data.
    pub(super) pty: bool,
}

impl Events<'_> {
    /// Sends one event; `false` once the client is gone. A client that went away does not stop
    /// the command (as with E2B's envd): the follower of `Start` goes on to its end.
    async fn send(&self, event: ProcessEvent) -> bool {
        let event = match event {
            ProcessEvent::Stdout(bytes) | ProcessEvent::Stderr(bytes) if self.pty => {
                ProcessEvent::Pty(bytes)
            }
            other => other,
        };
        self.tx.send(message(&event.response())).await.is_ok()
    }
}

/// The whole stream of one command: start, output, end.
pub(super) async fn follow(
    app: &App,
    reached: &Reached,
    pid: u32,
    execution_id: &str,
    events: &Events<'_>,
) {
    events.send(ProcessEvent::Start { pid }).await;
    let live = app.streams.get(execution_id);
    let mut lossy = false;
    if let Some(stream) = &live {
        lossy = relay(stream, events).await;
    }
    let row = match finished(app, reached, execution_id, events).await {
        Ok(row) => row,
        Err(err) => {
            let _ = events.tx.send(end_stream(Some(&err))).await;
            return;
        }
    };
    if live.is_none() {
        // It ended before it could be followed: its stored output.
        send_stored(&row, events).await;
    }
    for note in truncation_notes(&row, lossy) {
        events.send(ProcessEvent::Stderr(note.into_bytes())).await;
    }
    events.send(ProcessEvent::End(end_event(&row))).await;
    let _ = events.tx.send(end_stream(None)).await;
}

/// Relays the live stream to its end; whether it left output out (its event bound).
async fn relay(stream: &Arc<Stream>, events: &Events<'_>) -> bool {
    let mut from = 0;
    loop {
        let batch = match events.keepalive {
            Some(every) => match tokio::time::timeout(every, stream.next_batch(from)).await {
                Ok(batch) => batch,
                Err(_) => {
                    events.send(ProcessEvent::Keepalive).await;
                    continue;
                }
            },
            None => stream.next_batch(from).await,
        };
        let Some(batch) = batch else {
            return false;
        };
        from += batch.len();
        for event in batch {
            match event {
                StreamEvent::Stdout(text) => {
                    events.send(ProcessEvent::Stdout(text.into_bytes())).await;
                }
                StreamEvent::Stderr(text) => {
                    events.send(ProcessEvent::Stderr(text.into_bytes())).await;
                }
                StreamEvent::Exit(summary) => {
                    return summary.get("stream_truncated") == Some(&serde_json::Value::Bool(true));
                }
            }
        }
    }
}

/// The command's record once complete (the live stream ends once it is stored).
async fn finished(
    app: &App,
    reached: &Reached,
    execution_id: &str,
    events: &Events<'_>,
) -> Result<ExecutionRow, ConnectError> {
    let mut last_sent = tokio::time::Instant::now();
    loop {
        let row = app
            .get_execution(&reached.key, execution_id)
            .await
            .map_err(|err| {
                ConnectError::new(
                    Code::Unavailable,
                    format!("following the command failed: {err}"),
                )
            })?;
        if row.finished_at.is_some() {
            return Ok(row);
        }
        tokio::time::sleep(POLL).await;
        if events
            .keepalive
            .is_some_and(|every| last_sent.elapsed() >= every)
        {
            events.send(ProcessEvent::Keepalive).await;
            last_sent = tokio::time::Instant::now();
        }
    }
}

async fn send_stored(row: &ExecutionRow, events: &Events<'_>) {
    for (bytes, stdout) in [(&row.stdout, true), (&row.stderr, false)] {
        for chunk in bytes.as_deref().unwrap_or_default().chunks(CHUNK) {
            let event = if stdout {
                ProcessEvent::Stdout(chunk.to_vec())
            } else {
                ProcessEvent::Stderr(chunk.to_vec())
            };
            events.send(event).await;
        }
    }
}

/// What the command printed that the events do not carry, said on stderr (never silently
/// lost): output past the execution's `output_bytes` (not kept, the record says truncated),
/// or past the live stream's event bound (kept in the record).
fn truncation_notes(row: &ExecutionRow, lossy: bool) -> Vec<String> {
    let limit = row
        .limits
        .as_ref()
        .map_or_else(|| "its".to_owned(), |l| l.output_bytes.to_string());
    let mut notes = Vec::new();
    for (name, truncated) in [
        ("stdout", row.stdout_truncated),
        ("stderr", row.stderr_truncated),
    ] {
        if truncated {
            notes.push(format!(
                "\n[sandgate: the command's {name} went past the execution's output limit \
                 ({limit} bytes); the rest was not kept (execution {}, truncated)]\n",
                row.id
            ));
        }
    }
    if lossy {
        notes.push(format!(
            "\n[sandgate: the live stream left output out; execution {} holds all of it]\n",
            row.id
        ));
    }
    notes
}

/// The end event of a finished record: the exit code, or why there is none.
pub(super) fn end_event(row: &ExecutionRow) -> EndEvent {
    match (row.exit_code, row.status) {
        (Some(code), ExecutionStatus::Succeeded | ExecutionStatus::Failed) => EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        },
        (code, status) => EndEvent {
            exit_code: code.unwrap_or(-1),
            exited: false,
            status: format!("signal: {status}"),
            error: Some(
                row.error
                    .clone()
                    .unwrap_or_else(|| format!("the command ended: {status}")),
            ),
        },
    }
}
