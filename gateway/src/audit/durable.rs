//! Writes that must not be lost: an execution's completion and an egress connection's close go
//! to PostgreSQL or, when it does not take them within [`WRITE_TIMEOUT`], to the local
//! [`Journal`]. The journal is replayed, oldest first, by [`replay_periodically`] and before
//! any of these writes, so nothing newer is recorded ahead of what waits there.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserializer, Serializer};
use tokio_util::sync::CancellationToken;

use super::egress::ConnectionClose;
use super::journal::{Entry, Journal, JournalError};
use super::{AuditError, AuditStore, Completion, ExecutionRow};

/// How long a write waits for the database before it goes to the journal instead.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The same for a connection close, which the proxy waits for at most its record timeout (5 s):
/// the journal must have it before then.
const CLOSE_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Time between two replay attempts while the journal holds something.
const REPLAY_INTERVAL: Duration = Duration::from_secs(1);

/// Where a record went.
#[derive(Debug)]
pub enum Durable<T> {
    /// Committed to the database.
    Stored(T),
    /// Kept in the local journal; written to the database when it answers again.
    Journaled,
}

#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// No journal is configured and the database did not take the record.
    #[error("the audit store did not take the record")]
    Unavailable(#[source] AuditError),
    /// The database did not take the record and the journal could not keep it: it is lost.
    #[error("the audit store did not take the record and the local journal could not keep it")]
    Journal(#[source] JournalError),
}

impl AuditStore {
    /// Records how an execution ended: in the database, or else in the journal.
    pub async fn complete_durably(
        &self,
        id: &str,
        done: &Completion,
    ) -> Result<Durable<ExecutionRow>, DurableError> {
        let finished_at = crate::ids::now_micros();
        let Some(journal) = self.journal.clone() else {
            return self
                .complete_execution(id, done, finished_at)
                .await
                .map(Durable::Stored)
                .map_err(DurableError::Unavailable);
        };
        if self.journal_drained().await {
            let write = self.complete_execution(id, done, finished_at);
            match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                Ok(Ok(row)) => return Ok(Durable::Stored(row)),
                Ok(Err(err)) => {
                    tracing::warn!(execution_id = %id, error = %crate::errors::error_chain(&err), "completion not stored; journaling it");
                }
                Err(_) => {
                    tracing::warn!(execution_id = %id, "completion not stored in time; journaling it")
                }
            }
        }
        let entry = Entry::Completion {
            execution_id: id.to_owned(),
            finished_at,
            completion: done.clone(),
        };
        append(journal, entry).await?;
        tracing::warn!(execution_id = %id, "completion journaled until the audit store returns");
        Ok(Durable::Journaled)
    }

    /// Records how an egress connection ended: in the database, or else in the journal.
    pub async fn close_connection_durably(
        &self,
        id: &str,
        close: &ConnectionClose,
    ) -> Result<Durable<()>, DurableError> {
        let Some(journal) = self.journal.clone() else {
            return self
                .close_connection(id, close)
                .await
                .map(Durable::Stored)
                .map_err(DurableError::Unavailable);
        };
        // No replay here (it could outlast the proxy's wait): behind anything pending, it is
        // journaled too, and the replay writes both in order.
        if journal.is_empty() {
            let write = self.close_connection(id, close);
            if let Ok(Ok(())) = tokio::time::timeout(CLOSE_WRITE_TIMEOUT, write).await {
                return Ok(Durable::Stored(()));
            }
        }
        let entry = Entry::ConnectionClose {
            connection_id: id.to_owned(),
            close: close.clone(),
        };
        append(journal, entry).await?;
        tracing::warn!(connection = %id, "connection close journaled until the audit store returns");
        Ok(Durable::Journaled)
    }

    /// Whether the journal holds nothing (after trying to replay it): only then may something
    /// newer be written straight to the database.
    pub async fn journal_drained(&self) -> bool {
        let Some(journal) = &self.journal else {
            return true;
        };
        if journal.is_empty() {
            return true;
        }
        if let Err(err) = self.replay_journal().await {
            tracing::warn!(error = %crate::errors::error_chain(&err), "journal replay failed");
        }
        journal.is_empty()
    }

    /// Whether the completion of `execution_id` waits in the journal.
    pub fn journal_holds(&self, execution_id: &str) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|journal| journal.holds_execution(execution_id))
    }

    /// Writes what the journal holds, oldest first, deleting each record once committed; stops
    /// at the first the database does not take. Returns how many were written.
    pub async fn replay_journal(&self) -> Result<usize, JournalError> {
        let Some(journal) = self.journal.clone() else {
            return Ok(0);
        };
        // One replay at a time; a caller that finds one running finds the journal not drained.
        let Some(_turn) = journal.replay_turn() else {
            return Ok(0);
        };
        if journal.is_empty() || self.ping().await.is_err() {
            return Ok(0);
        }
        let reader = Arc::clone(&journal);
        let pending = tokio::task::spawn_blocking(move || reader.pending())
            .await
            .unwrap_or_else(|err| Err(panicked(err)))?;
        let mut written = 0;
        for (seq, entry) in pending {
            match tokio::time::timeout(WRITE_TIMEOUT, self.write_entry(&entry)).await {
                Ok(Ok(())) => blocking(&journal, move |j| j.remove(seq)).await?,
                Ok(Err(err)) if refused_for_content(&err) => {
                    let kept = blocking(&journal, move |j| j.refuse(seq)).await?;
                    self.write_without_payload(&entry, &err, &kept).await;
                }
                Ok(Err(_)) | Err(_) => break,
            }
            written += 1;
        }
        if written > 0 {
            tracing::info!(written, left = journal.len(), "journal replayed");
        }
        Ok(written)
    }

    async fn write_entry(&self, entry: &Entry) -> Result<(), AuditError> {
        match entry {
            Entry::Completion {
                execution_id,
                finished_at,
                completion,
            } => self
                .complete_execution(execution_id, completion, *finished_at)
                .await
                .map(drop),
            Entry::ConnectionClose {
                connection_id,
                close,
            } => self.close_connection(connection_id, close).await,
        }
    }

    /// A completion the database refuses as it is: its end (status, exit code, outputs) is
    /// still written, without stdout and stderr, saying where the whole record was kept.
    async fn write_without_payload(&self, entry: &Entry, err: &AuditError, kept: &std::path::Path) {
        tracing::error!(error = %crate::errors::error_chain(err), kept = %kept.display(), "the audit store refused a journaled record");
        let Entry::Completion {
            execution_id,
            finished_at,
            completion,
        } = entry
        else {
            return;
        };
        let bare = Completion {
            stdout: Vec::new(),
            stderr: Vec::new(),
            error: Some(format!(
                "the audit store refused this execution's output; the whole record is kept in {}",
                kept.display()
            )),
            ..completion.clone()
        };
        if let Err(err) = self
            .complete_execution(execution_id, &bare, *finished_at)
            .await
        {
            tracing::error!(execution_id = %execution_id, error = %crate::errors::error_chain(&err), "the end of an execution could not be stored");
        }
    }
}

/// Replays the journal whenever it holds something, until shutdown.
pub async fn replay_periodically(store: AuditStore, shutdown: CancellationToken) {
    loop {
        if let Err(err) = store.replay_journal().await {
            tracing::error!(error = %crate::errors::error_chain(&err), "journal replay failed");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(REPLAY_INTERVAL) => {}
        }
    }
}

async fn append(journal: Arc<Journal>, entry: Entry) -> Result<u64, DurableError> {
    tokio::task::spawn_blocking(move || journal.append(&entry))
        .await
        .unwrap_or_else(|err| Err(panicked(err)))
        .map_err(DurableError::Journal)
}

async fn blocking<T: Send + 'static>(
    journal: &Arc<Journal>,
    work: impl FnOnce(&Journal) -> Result<T, JournalError> + Send + 'static,
) -> Result<T, JournalError> {
    let journal = Arc::clone(journal);
    tokio::task::spawn_blocking(move || work(&journal))
        .await
        .unwrap_or_else(|err| Err(panicked(err)))
}

fn panicked(err: tokio::task::JoinError) -> JournalError {
    JournalError::Io {
        path: std::path::PathBuf::from("journal"),
        err: std::io::Error::other(err),
    }
}

/// The database refuses the record itself (data or integrity error, or no such row): writing
/// it again can never succeed, so it must not block the journal.
fn refused_for_content(err: &AuditError) -> bool {
    let AuditError::Unavailable(err) = err else {
        return false;
    };
    match err {
        sqlx::Error::RowNotFound => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("22") || code.starts_with("23")),
        _ => false,
    }
}

/// Text for a `text` column: PostgreSQL refuses NUL there, so it becomes U+FFFD.
pub fn without_nul(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}

/// Bytes as standard base64 in JSON.
pub mod base64_bytes {
    use base64::Engine as _;

    use serde::Deserialize;

    use super::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(from)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}
