//! File operations on an open session's sandbox: read, write, stat, list, mkdir, rename,
//! remove. The sandbox's init performs them (never the runner or anything the program could
//! have replaced), confined to the sandbox's writable places, never through a symlink
//! (`sandbox_protocol`'s `files` module, sandbox-init's `fileops`); they travel on the
//! session's own stdin between turns.
//!
//! Who may: exactly who may run code in the session (`get_session`: its opening key, or a key
//! the policy shares it with; another key, or another tenant, gets 404). When: while no
//! execution runs in it (409 `conflict` otherwise, as for a second execution), on the replica
//! that holds it (409 on another: file operations are not relayed). A write, a move and a
//! removal are audited (`session.file_written` with the bytes' SHA-256, `session.file_moved`,
//! `session.file_removed`), committed before the init carries them out: a change the store
//! does not take is not made (503). Paths outside the places are refused here, before
//! anything is recorded; what only the sandbox can see (a planted symlink) is refused there.
//! Reads, stats and listings are not audited. Each operation counts as use of the session
//! (its idle timer restarts).

use std::sync::PoisonError;
use std::time::Instant;

use base64::Engine as _;
use sha2::Digest as _;

use api_types::EventKind;
use sandbox_protocol::{
    locate, FileAnswer, FileEntry, FileFailure, FileRequest, FILE_PLACES, MAX_FILE_BYTES,
};

use super::refusals::bounded_text;
use super::{App, AppError};
use crate::audit::events::session_files::{FileMoved, FileRemoved, FileWritten, NoDecision};
use crate::audit::events::{column, no_reasons};
use crate::audit::sessions::SessionRow;
use crate::audit::{ApiKey, NewEvent};
use crate::session_wire::{ClosedReason, SessionStatus};

pub use sandbox_protocol::{FileKind, MAX_LIST_DEPTH, MAX_LIST_ENTRIES};

/// Why a file operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SessionFileError {
    /// The session (404, 409), the store (503), the runtime.
    #[error(transparent)]
    App(#[from] AppError),
    /// Refused by the path rules or by the sandbox's init.
    #[error("{message}")]
    Refused {
        failure: FileFailure,
        message: String,
    },
}

type Answer<T> = Result<T, SessionFileError>;

/// A listing's answer.
#[derive(Debug, Clone)]
pub struct Listing {
    pub entries: Vec<FileEntry>,
    /// [`MAX_LIST_ENTRIES`] stopped it.
    pub truncated: bool,
}

impl App {
    /// The file's bytes (at most [`MAX_FILE_BYTES`]) and its entry.
    pub async fn session_file_read(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
    ) -> Answer<(FileEntry, Vec<u8>)> {
        let path = placed(path)?;
        let request = FileRequest::Read { path };
        match self.file_op(caller, id, request, None).await? {
            FileAnswer::Content { content_b64, entry } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(content_b64)
                    .map_err(|err| unexpected(&err))?;
                Ok((entry, bytes))
            }
            other => Err(unexpected(&format!("{other:?}"))),
        }
    }

    /// Creates or replaces a regular file (its directory must exist).
    pub async fn session_file_write(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
        content: &[u8],
        mode: Option<u32>,
    ) -> Answer<FileEntry> {
        let path = placed(path)?;
        if content.len() > MAX_FILE_BYTES {
            return Err(refused(
                FileFailure::TooLarge,
                format!(
                    "{} bytes is over the limit of {MAX_FILE_BYTES} bytes per file",
                    content.len()
                ),
            ));
        }
        if mode.is_some_and(|mode| mode > 0o777) {
            return Err(refused(FileFailure::Invalid, "mode must be within 0o777"));
        }
        let written = FileWritten {
            session_id: id.to_owned(),
            path: bounded_text(&path),
            bytes: content.len() as u64,
            sha256: hex::encode(sha2::Sha256::digest(content)),
            mode,
        };
        let request = FileRequest::Write {
            path,
            content_b64: base64::engine::general_purpose::STANDARD.encode(content),
            mode,
        };
        let event = (EventKind::SessionFileWritten, column(&written));
        entry(self.file_op(caller, id, request, Some(event)).await?)
    }

    pub async fn session_file_stat(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
    ) -> Answer<FileEntry> {
        let request = FileRequest::Stat {
            path: placed(path)?,
        };
        entry(self.file_op(caller, id, request, None).await?)
    }

    /// The entries under a directory, `depth` levels down (1 to [`MAX_LIST_DEPTH`]).
    pub async fn session_file_list(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Answer<Listing> {
        if !(1..=MAX_LIST_DEPTH).contains(&depth) {
            return Err(refused(
                FileFailure::Invalid,
                format!("depth must be 1 to {MAX_LIST_DEPTH}"),
            ));
        }
        let request = FileRequest::List {
            path: placed(path)?,
            depth,
        };
        match self.file_op(caller, id, request, None).await? {
            FileAnswer::Entries { entries, truncated } => Ok(Listing { entries, truncated }),
            other => Err(unexpected(&format!("{other:?}"))),
        }
    }

    /// Creates the directory and its missing parents.
    pub async fn session_file_mkdir(
        &self,
        caller: &ApiKey,
        id: &str,
        path: &str,
    ) -> Answer<FileEntry> {
        let request = FileRequest::Mkdir {
            path: placed(path)?,
        };
        entry(self.file_op(caller, id, request, None).await?)
    }

    /// Moves or renames (audited).
    pub async fn session_file_rename(
        &self,
        caller: &ApiKey,
        id: &str,
        from: &str,
        to: &str,
    ) -> Answer<FileEntry> {
        let (from, to) = (placed(from)?, placed(to)?);
        let moved = FileMoved {
            session_id: id.to_owned(),
            from: bounded_text(&from),
            to: bounded_text(&to),
        };
        let event = (EventKind::SessionFileMoved, column(&moved));
        let request = FileRequest::Rename { from, to };
        entry(self.file_op(caller, id, request, Some(event)).await?)
    }

    /// Removes a file, a symlink, or a directory with everything under it (audited).
    pub async fn session_file_remove(&self, caller: &ApiKey, id: &str, path: &str) -> Answer<()> {
        let path = placed(path)?;
        let removed = FileRemoved {
            session_id: id.to_owned(),
            path: bounded_text(&path),
        };
        let event = (EventKind::SessionFileRemoved, column(&removed));
        match self
            .file_op(caller, id, FileRequest::Remove { path }, Some(event))
            .await?
        {
            FileAnswer::Removed => Ok(()),
            other => Err(unexpected(&format!("{other:?}"))),
        }
    }

    /// The session, held here and idle; the event committed; the init's answer.
    async fn file_op(
        &self,
        caller: &ApiKey,
        id: &str,
        request: FileRequest,
        event: Option<(EventKind, serde_json::Value)>,
    ) -> Answer<FileAnswer> {
        let row = self.get_session(caller, id).await?;
        let open = self.sessions.get(id).ok_or_else(|| not_held(&row))?;
        let Ok(mut guard) = open.held.try_lock() else {
            return Err(AppError::Conflict(format!(
                "session {id} is busy: file operations wait until its execution ended"
            ))
            .into());
        };
        let held = guard.as_mut().ok_or_else(|| not_held(&row))?;
        if let Some((kind, input)) = event {
            let event = NewEvent {
                kind,
                execution_id: None,
                key_id: Some(caller.id.clone()),
                tenant: Some(caller.tenant.clone()),
                decision_id: None,
                allow: None,
                reasons: no_reasons(),
                input,
                decision: column(&NoDecision {}),
                policy_revision: None,
            };
            self.audit
                .record_event(&event)
                .await
                .map_err(AppError::from)?;
        }
        let answer = held.sandbox.file_op(request).await;
        *open
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        match answer {
            Ok(FileAnswer::Failed { failure, message }) => Err(refused(failure, message)),
            Ok(answer) => Ok(answer),
            Err(err) => Err(AppError::Internal(format!("the session's sandbox: {err}")).into()),
        }
    }
}

/// The normalised path, or a refusal naming the places.
pub(super) fn placed(path: &str) -> Answer<String> {
    locate(path).map(|at| at.path()).map_err(|failure| {
        refused(
            failure,
            format!(
                "{:?} is not under the sandbox's writable places ({}); '..' cannot leave them",
                path.chars().take(200).collect::<String>(),
                FILE_PLACES.join(", ")
            ),
        )
    })
}

pub(super) fn refused(failure: FileFailure, message: impl Into<String>) -> SessionFileError {
    SessionFileError::Refused {
        failure,
        message: message.into(),
    }
}

fn entry(answer: FileAnswer) -> Answer<FileEntry> {
    match answer {
        FileAnswer::Entry { entry } => Ok(entry),
        other => Err(unexpected(&format!("{other:?}"))),
    }
}

fn unexpected(what: &dyn std::fmt::Display) -> SessionFileError {
    AppError::Internal(format!("unexpected answer from the session's init: {what}")).into()
}

/// Why a session this replica does not hold open takes no file operation.
fn not_held(row: &SessionRow) -> AppError {
    let id = &row.id;
    if row.is(SessionStatus::PendingApproval) {
        return AppError::Conflict(format!(
            "session {id} awaits approval: it has no sandbox until a reviewer approves it"
        ));
    }
    if row.is(SessionStatus::Closed) {
        return AppError::Conflict(format!(
            "session {id} is closed ({})",
            row.closed_reason
                .map_or("unknown reason", ClosedReason::as_str)
        ));
    }
    AppError::Conflict(format!(
        "session {id} is held by replica {}: file operations are served only there",
        row.instance
    ))
}
