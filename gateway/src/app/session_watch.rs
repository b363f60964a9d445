//! Directory watchers in an open session's sandbox (E2B's `files.watch_dir`;
//! `sandbox_protocol`'s `watch` module): each one a watcher started by the runtime as the
//! program's user (never the init), confined as the session's file operations are: the path
//! checked here against the writable places before anything starts, then opened in the sandbox
//! component by component without following a symlink. Who may: who may run code in the
//! session (`get_session`). Watching changes nothing, so nothing is audited per event; a
//! watcher is not recorded either (as stats and listings are not). A watcher ends with its
//! sandbox (closed, killed: its exec's stream ends) or when its requests end. While it
//! watches it is use of the session, counted with its running processes
//! (`OpenSession::processes`): no pause, snapshot or idle close under it, since a checkpoint
//! cannot carry the watcher's exec across a restore.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::session_files::{placed, refused, SessionFileError};
use super::session_runs::closed_conflict;
use super::sessions::OpenSession;
use super::{App, AppError};
use crate::audit::ApiKey;
use crate::runtime::procs::WatchSpec;
use crate::runtime::Channel;
use sandbox_protocol::{FileFailure, WatchLine, FLUSH_REQUEST, MAX_WATCH_LINE};

/// Longest wait for the session's lock (a running cell holds it) and for the watcher to be
/// watching.
const START_WAIT: Duration = Duration::from_secs(10);

/// A watching watcher: its lines, and where its requests go (dropped: it ends).
pub struct SessionWatcher {
    pub lines: BoxStream<'static, WatchLine>,
    requests: Pin<Box<dyn AsyncWrite + Send>>,
    _in_use: InUse,
}

/// The session is in use while its watcher lives (counted as a running process).
struct InUse(Arc<OpenSession>);

impl InUse {
    fn of(open: &Arc<OpenSession>) -> InUse {
        open.processes.fetch_add(1, Ordering::SeqCst);
        InUse(Arc::clone(open))
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.processes.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for SessionWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionWatcher").finish_non_exhaustive()
    }
}

impl SessionWatcher {
    /// Asks for every event the sandbox's kernel queued so far (answered by
    /// [`WatchLine::Flushed`] among the lines); `false` once the watcher is gone.
    pub async fn request_flush(&mut self) -> bool {
        let line = format!("{FLUSH_REQUEST}\n");
        self.requests.write_all(line.as_bytes()).await.is_ok()
            && self.requests.flush().await.is_ok()
    }
}

impl App {
    /// Starts watching `path` in session `id`; returns once the watcher watches, or its
    /// refusal (outside the places, a symlink, not a directory, too many directories).
    pub async fn start_session_watcher(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<SessionWatcher, SessionFileError> {
        let path = placed(path)?;
        let row = self.get_session(caller, id).await?;
        let open = self
            .sessions
            .get(id)
            .ok_or_else(|| closed_conflict(id, &row))?;
        let container = {
            let guard = tokio::time::timeout(START_WAIT, open.held.lock())
                .await
                .map_err(|_| {
                    AppError::Conflict(format!(
                        "session {id} is busy with a cell; watch once it ended"
                    ))
                })?;
            let held = guard.as_ref().ok_or_else(|| closed_conflict(id, &row))?;
            held.sandbox.name().to_owned()
        };
        let spec = WatchSpec {
            tag: crate::ids::new("wt"),
            path,
            recursive,
        };
        let started = self
            .runtime
            .start_watcher(&container, spec)
            .await
            .map_err(|err| AppError::ReplicaUnavailable(format!("starting the watcher: {err}")))?;
        let requests = started.input.ok_or_else(|| {
            AppError::Internal("the watcher's requests were not attached".to_owned())
        })?;
        let in_use = InUse::of(&open);
        // The lines end when the session closes, whenever dockerd ends the exec's stream.
        let closing = open.closing.clone();
        let mut lines = watch_lines(started.output)
            .take_until(async move { closing.cancelled().await })
            .boxed();
        match tokio::time::timeout(START_WAIT, lines.next()).await {
            Ok(Some(WatchLine::Ready)) => Ok(SessionWatcher {
                lines,
                requests,
                _in_use: in_use,
            }),
            Ok(Some(WatchLine::Failed { failure, message })) => Err(refused(failure, message)),
            Ok(other) => {
                Err(AppError::Internal(format!("the watcher did not start: {other:?}")).into())
            }
            Err(_) => Err(AppError::ReplicaUnavailable(
                "the watcher did not start in time".to_owned(),
            )
            .into()),
        }
    }
}

/// The watcher's stdout as lines (a line past [`MAX_WATCH_LINE`], or one that is not a
/// [`WatchLine`], is reported as lost events); what it says on stderr ends it as a failure.
fn watch_lines(
    output: BoxStream<'static, Result<(Channel, Vec<u8>), String>>,
) -> BoxStream<'static, WatchLine> {
    let state = (output, Vec::<u8>::new(), Vec::<WatchLine>::new());
    futures_util::stream::unfold(state, |(mut output, mut held, mut ready)| async move {
        loop {
            if let Some(line) = ready.pop() {
                return Some((line, (output, held, ready)));
            }
            match output.next().await? {
                Ok((Channel::Stdout, bytes)) => {
                    held.extend_from_slice(&bytes);
                    ready = split_lines(&mut held);
                    ready.reverse();
                }
                Ok((Channel::Stderr, bytes)) => {
                    let message = String::from_utf8_lossy(&bytes).trim().to_owned();
                    let line = WatchLine::Failed {
                        failure: FileFailure::Io,
                        message,
                    };
                    return Some((line, (output, held, ready)));
                }
                Err(_) => return None,
            }
        }
    })
    .boxed()
}

/// The whole lines in `held`, taken out of it.
fn split_lines(held: &mut Vec<u8>) -> Vec<WatchLine> {
    let mut lines = Vec::new();
    while let Some(end) = held.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = held.drain(..=end).collect();
        lines.push(
            serde_json::from_slice(&line).unwrap_or_else(|_| WatchLine::Lost {
                why: "the watcher wrote a line sandgate could not read".to_owned(),
            }),
        );
    }
    if held.len() > MAX_WATCH_LINE {
        held.clear();
        lines.push(WatchLine::Lost {
            why: format!("the watcher wrote a line over {MAX_WATCH_LINE} bytes"),
        });
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_taken_whole() {
        let mut held = b"{\"line\":\"ready\"}\n{\"line\":\"flu".to_vec();
        assert_eq!(split_lines(&mut held), [WatchLine::Ready]);
        held.extend_from_slice(b"shed\"}\nnot json\n");
        let lines = split_lines(&mut held);
        assert_eq!(lines[0], WatchLine::Flushed);
        assert!(matches!(lines[1], WatchLine::Lost { .. }));
        assert!(held.is_empty());
    }
}
