//! The local journal: records the gateway must not lose when PostgreSQL is down.
//!
//! An execution's completion and an egress connection's close are facts that happened while the
//! database may have been unreachable; unlike a decision (which fails closed: nothing runs), they
//! cannot be refused. So when one cannot be written, it is written here instead: one file per
//! record under `<data_dir>/journal/`, written to a temporary name, `fsync`ed, renamed and the
//! directory `fsync`ed, so it survives a crash of the gateway or the machine. When the database
//! answers again the journal is replayed oldest first, and a record is deleted only once its
//! row is committed. While anything is pending, later completions and closes are journaled
//! behind it and new egress attempts are refused, so nothing is recorded out of order.
//!
//! A record the database refuses for its content (an SQLSTATE of class 22 or 23: it can never
//! be written as it is) is moved to `journal/refused/` and its row is written without the
//! payload, saying so; it never blocks the journal.
//!
//! Small API: [`Journal::open`], [`Journal::append`], [`Journal::pending`],
//! [`Journal::remove`], [`Journal::refuse`], [`Journal::holds_execution`]; the replay itself is
//! `AuditStore::replay_journal` (in `durable.rs`), which is the only writer of what it holds.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::egress::ConnectionClose;
use super::Completion;

/// Where refused records are kept, inside the journal directory.
const REFUSED: &str = "refused";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}")]
    Io {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("journal record {path} is not readable JSON")]
    Corrupt {
        path: PathBuf,
        #[source]
        err: serde_json::Error,
    },
}

/// One record the database did not take in time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Entry {
    /// How an execution ended (the `executions` row's final columns).
    Completion {
        execution_id: String,
        finished_at: DateTime<Utc>,
        completion: Completion,
    },
    /// How an egress connection ended (its `egress_connections` row's final columns).
    ConnectionClose {
        connection_id: String,
        close: ConnectionClose,
    },
}

impl Entry {
    /// The execution a completion belongs to (closes name only their connection).
    fn execution_id(&self) -> Option<&str> {
        match self {
            Entry::Completion { execution_id, .. } => Some(execution_id),
            Entry::ConnectionClose { .. } => None,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Sequence number of the next record.
    next: u64,
    /// Pending records by sequence: the execution each completion belongs to.
    pending: BTreeMap<u64, Option<String>>,
}

/// The journal directory and what it holds.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    state: Mutex<State>,
    /// Set while a replay runs: one at a time (another caller finds it set and moves on).
    replaying: AtomicBool,
}

impl Journal {
    /// Opens (creating, mode 0700) the journal in `dir` and reads what a previous run left.
    pub fn open(dir: &Path) -> Result<Journal, JournalError> {
        let io = |err| JournalError::Io {
            path: dir.to_owned(),
            err,
        };
        fs::create_dir_all(dir.join(REFUSED)).map_err(io)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)?;
        let journal = Journal {
            dir: dir.to_owned(),
            state: Mutex::new(State::default()),
            replaying: AtomicBool::new(false),
        };
        let mut state = State::default();
        for (seq, entry) in journal.read_all()? {
            state.next = state.next.max(seq + 1);
            state
                .pending
                .insert(seq, entry.execution_id().map(str::to_owned));
        }
        *journal.lock() = state;
        Ok(journal)
    }

    /// Writes `entry` durably (fsync of the file and the directory) and returns its sequence
    /// number. Blocking: call it off the async runtime's threads.
    pub fn append(&self, entry: &Entry) -> Result<u64, JournalError> {
        let mut state = self.lock();
        let seq = state.next;
        let path = self.path_of(seq);
        let temporary = path.with_extension("tmp");
        let io = |err| JournalError::Io {
            path: path.clone(),
            err,
        };
        let bytes = serde_json::to_vec(entry).map_err(|err| JournalError::Corrupt {
            path: path.clone(),
            err,
        })?;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(io)?;
        file.write_all(&bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        fs::rename(&temporary, &path).map_err(io)?;
        sync_dir(&self.dir).map_err(io)?;
        state.next = seq + 1;
        state
            .pending
            .insert(seq, entry.execution_id().map(str::to_owned));
        Ok(seq)
    }

    /// Every pending record, oldest first, read from disk.
    pub fn pending(&self) -> Result<Vec<(u64, Entry)>, JournalError> {
        self.read_all()
    }

    /// Forgets a record once the database holds it.
    pub fn remove(&self, seq: u64) -> Result<(), JournalError> {
        let path = self.path_of(seq);
        let io = |err| JournalError::Io {
            path: path.clone(),
            err,
        };
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map_err(io)?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io(err)),
        }
        self.lock().pending.remove(&seq);
        Ok(())
    }

    /// Moves a record the database refuses for its content to `refused/`, for a person to read.
    pub fn refuse(&self, seq: u64) -> Result<PathBuf, JournalError> {
        let from = self.path_of(seq);
        let to = self.dir.join(REFUSED).join(format!("{seq:020}.json"));
        fs::rename(&from, &to).map_err(|err| JournalError::Io {
            path: from.clone(),
            err,
        })?;
        sync_dir(&self.dir).map_err(|err| JournalError::Io {
            path: self.dir.clone(),
            err,
        })?;
        self.lock().pending.remove(&seq);
        Ok(to)
    }

    /// Whether nothing waits to be replayed.
    pub fn is_empty(&self) -> bool {
        self.lock().pending.is_empty()
    }

    /// How many records wait to be replayed.
    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether the completion of `execution_id` waits here (its record is not abandoned: the
    /// reaper must leave it to the replay).
    pub fn holds_execution(&self, execution_id: &str) -> bool {
        self.lock()
            .pending
            .values()
            .any(|id| id.as_deref() == Some(execution_id))
    }

    /// The right to replay, if no replay runs; released when the turn is dropped.
    pub fn replay_turn(&self) -> Option<ReplayTurn<'_>> {
        self.replaying
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| ReplayTurn(&self.replaying))
    }

    fn path_of(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.json"))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The records on disk (`<seq>.json`), oldest first. Temporary files a crash left (written
    /// but never renamed, so never acknowledged) are removed.
    fn read_all(&self) -> Result<Vec<(u64, Entry)>, JournalError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |err| JournalError::Io { path, err }
        };
        let mut found = BTreeMap::new();
        for item in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let path = item.map_err(io(&self.dir))?.path();
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            if name.ends_with(".tmp") {
                fs::remove_file(&path).map_err(io(&path))?;
                continue;
            }
            let Some(seq) = name
                .strip_suffix(".json")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let bytes = fs::read(&path).map_err(io(&path))?;
            let entry = serde_json::from_slice(&bytes)
                .map_err(|err| JournalError::Corrupt { path, err })?;
            found.insert(seq, entry);
        }
        Ok(found.into_iter().collect())
    }
}

/// Held by the one replay that runs.
#[derive(Debug)]
pub struct ReplayTurn<'a>(&'a AtomicBool);

impl Drop for ReplayTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::Collected;

    fn completion(id: &str) -> Entry {
        Entry::Completion {
            execution_id: id.to_owned(),
            finished_at: crate::ids::now_micros(),
            completion: Completion {
                status: crate::status::ExecutionStatus::Succeeded,
                exit_code: Some(0),
                duration_ms: 12,
                stdout: b"a\0b\xff\n".to_vec(),
                stderr: Vec::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                error: None,
                outputs: Collected::default(),
            },
        }
    }

    #[test]
    fn records_survive_a_reopen_in_order_and_go_once_removed() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        let first = journal.append(&completion("ex_1")).unwrap();
        let close = Entry::ConnectionClose {
            connection_id: "cn_1".to_owned(),
            close: ConnectionClose {
                bytes_up: 40_000,
                bytes_down: 7,
                duration_ms: 3,
                close_reason: "egress.completed".to_owned(),
                error: None,
                closed_at: crate::ids::now_micros(),
            },
        };
        let second = journal.append(&close).unwrap();
        assert!(first < second);
        drop(journal);

        let journal = Journal::open(dir.path()).unwrap();
        assert!(journal.holds_execution("ex_1"));
        let pending = journal.pending().unwrap();
        assert_eq!(
            pending,
            vec![(first, completion_like(&pending[0].1)), (second, close)]
        );
        journal.remove(first).unwrap();
        assert!(!journal.holds_execution("ex_1"));
        assert_eq!(journal.len(), 1);
        let third = journal.append(&completion("ex_2")).unwrap();
        assert!(
            third > second,
            "sequence numbers never go back after a reopen"
        );
    }

    /// The stored completion, checked field by field where it matters (bytes exact).
    fn completion_like(entry: &Entry) -> Entry {
        let Entry::Completion { completion, .. } = entry else {
            panic!("not a completion: {entry:?}");
        };
        assert_eq!(completion.stdout, b"a\0b\xff\n");
        assert_eq!(completion.status, crate::status::ExecutionStatus::Succeeded);
        entry.clone()
    }

    #[test]
    fn an_unacknowledged_temporary_file_is_dropped_and_a_refused_record_moves_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("00000000000000000009.tmp"), b"{half").unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        assert!(journal.is_empty());
        assert!(!dir.path().join("00000000000000000009.tmp").exists());
        let seq = journal.append(&completion("ex_3")).unwrap();
        let moved = journal.refuse(seq).unwrap();
        assert!(moved.is_file());
        assert!(journal.is_empty());
        assert!(Journal::open(dir.path()).unwrap().is_empty());
    }
}
