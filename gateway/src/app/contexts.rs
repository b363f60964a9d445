//! Code contexts of a session (E2B's `/contexts`, docs/e2b.md): besides its default context
//! (the session's runner), a session may hold up to [`MAX_CONTEXTS`] more, each its own
//! interpreter (Python or bash) with its own state in the same sandbox, started by the runtime
//! as a second session init beside PID 1 (`runtime::CodeContext`), on the same isolation floor
//! and with the same end markers and report keys. Their state lasts across their cells, is
//! reset by a restart and gone on removal; they end with the sandbox (and with a pause: the
//! checkpoint keeps the session's runner only).
//!
//! Opening one runs no code of the caller's: it is the session's own environment and a cwd.
//! Every cell in one is a session execution like any other (`app::session_runs`): decided with
//! `request.e2b.context` naming it, recorded before it runs, completed with its output.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use super::sessions::{opening_env, OpenSession};
use super::{App, AppError};
use crate::audit::ApiKey;
use crate::runtime::{CodeContext, Job, SessionRunner};

/// Extra contexts a session may hold at once (its default context not counted).
pub const MAX_CONTEXTS: usize = 4;
/// Longest cwd accepted for a context.
const MAX_CWD: usize = 4096;

/// What a context is, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextInfo {
    pub id: String,
    pub runner: SessionRunner,
    pub cwd: String,
}

/// The extra contexts of one open session.
#[derive(Debug, Default)]
pub(super) struct Contexts {
    entries: Mutex<BTreeMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    info: ContextInfo,
    /// `None` while a cell runs in it (taken out by that cell), or once it ended (`ended`).
    running: Option<Box<dyn CodeContext>>,
    /// Why it ended under a cell (a timeout ends a context), until it is restarted.
    ended: Option<String>,
}

/// A context taken out of its session for one cell; put back after it.
#[derive(Debug)]
pub(super) struct Taken {
    pub(super) info: ContextInfo,
    pub(super) running: Box<dyn CodeContext>,
}

impl Contexts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The contexts, in the order of their ids (made in creation order).
    pub(super) fn list(&self) -> Vec<ContextInfo> {
        self.lock().values().map(|e| e.info.clone()).collect()
    }

    /// The context `id` for a cell: taken out until [`Contexts::put_back`]. Only one cell runs
    /// in a session at a time (the session's `held` lock), so none is taken already.
    pub(super) fn take(&self, id: &str) -> Result<Taken, AppError> {
        let mut entries = self.lock();
        let entry = entries.get_mut(id).ok_or_else(|| not_found(id))?;
        if let Some(why) = &entry.ended {
            return Err(AppError::Conflict(format!(
                "context {id} ended: {why}; restart_code_context starts it afresh"
            )));
        }
        let running = entry
            .running
            .take()
            .ok_or_else(|| AppError::Conflict(format!("context {id} is busy")))?;
        Ok(Taken {
            info: entry.info.clone(),
            running,
        })
    }

    /// After its cell: back in service, or (`ended`) kept as ended, to be restarted.
    pub(super) async fn put_back(&self, taken: Taken, ended: Option<String>) {
        let closing = {
            let mut entries = self.lock();
            match entries.get_mut(&taken.info.id) {
                Some(entry) if ended.is_none() => {
                    entry.running = Some(taken.running);
                    None
                }
                Some(entry) => {
                    entry.ended = ended;
                    Some(taken.running)
                }
                // Removed meanwhile (never: removal waits for the session's lock).
                None => Some(taken.running),
            }
        };
        if let Some(running) = closing {
            running.close().await;
        }
    }

    /// The language of context `id`, if the session has it.
    pub(super) fn runner(&self, id: &str) -> Option<SessionRunner> {
        self.lock().get(id).map(|entry| entry.info.runner)
    }

    /// Ends the running ones, kept as ended (`why`) until restarted: a pause checkpoints the
    /// session's runner only.
    pub(super) async fn end_all(&self, why: &str) {
        let running: Vec<_> = self
            .lock()
            .values_mut()
            .filter_map(|entry| {
                let running = entry.running.take()?;
                entry.ended = Some(why.to_owned());
                Some(running)
            })
            .collect();
        for context in running {
            context.close().await;
        }
    }

    /// Ends them all (the session closes).
    pub(super) async fn close_all(&self) {
        let all: Vec<_> = std::mem::take(&mut *self.lock())
            .into_values()
            .filter_map(|entry| entry.running)
            .collect();
        for running in all {
            running.close().await;
        }
    }
}

fn not_found(id: &str) -> AppError {
    // E2B's own words for it (its interpreter's 404).
    AppError::NotFoundWhy(format!("Context {id} not found"))
}

/// A context's cwd: absolute, no `..`, no control character (the init enters it, and fails
/// clearly when it cannot).
fn checked_cwd(cwd: &str) -> Result<String, AppError> {
    let fine = cwd.starts_with('/')
        && cwd.len() <= MAX_CWD
        && !cwd.chars().any(char::is_control)
        && !cwd.split('/').any(|part| part == "..");
    if fine {
        Ok(cwd.to_owned())
    } else {
        Err(AppError::Invalid(format!(
            "cwd {:?} is not an absolute path without `..`",
            crate::app::refusals::bounded_text(cwd)
        )))
    }
}

impl App {
    /// The open session `id` of `caller` (404 for anyone else's), held on this replica; 503
    /// naming the replica that holds it otherwise (its contexts live in that replica's memory,
    /// as its processes do: `start_session_process`).
    async fn context_session(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<std::sync::Arc<OpenSession>, AppError> {
        if let Some(session) = self.session_held_elsewhere(caller, id).await? {
            return Err(AppError::ReplicaUnavailable(format!(
                "session {id} is served by replica {}: use its code contexts there",
                session.instance
            )));
        }
        let row = self.get_session(caller, id).await?;
        self.sessions
            .get(id)
            .ok_or_else(|| super::session_runs::closed_conflict(id, &row))
    }

    /// The session's extra contexts.
    pub async fn list_contexts(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<Vec<ContextInfo>, AppError> {
        Ok(self.context_session(caller, id).await?.contexts.list())
    }

    /// The runner of context `context` of session `id`: 404 (E2B's "Context ... not found")
    /// unless the session has it.
    pub async fn context_runner(
        &self,
        caller: &ApiKey,
        id: &str,
        context: &str,
    ) -> Result<SessionRunner, AppError> {
        let open = self.context_session(caller, id).await?;
        open.contexts
            .runner(context)
            .ok_or_else(|| not_found(context))
    }

    /// Starts a new context in the session: at most [`MAX_CONTEXTS`]; 409 while a cell runs.
    pub async fn create_context(
        &self,
        caller: &ApiKey,
        id: &str,
        runner: SessionRunner,
        cwd: &str,
    ) -> Result<ContextInfo, AppError> {
        let cwd = checked_cwd(cwd)?;
        let open = self.context_session(caller, id).await?;
        let mut guard = open.held.try_lock().map_err(|_| busy(id))?;
        let held = guard
            .as_mut()
            .ok_or_else(|| AppError::Conflict(format!("session {id} has no running sandbox")))?;
        if open.contexts.lock().len() >= MAX_CONTEXTS {
            return Err(AppError::RateLimited(format!(
                "sandbox {id} has {MAX_CONTEXTS} code contexts already, the most it may hold \
                 besides its default one: remove one (remove_code_context) first"
            )));
        }
        let info = ContextInfo {
            id: crate::ids::new("cx"),
            runner,
            cwd,
        };
        let running = held
            .sandbox
            .open_context(runner, context_job(held, &info.cwd))
            .await
            .map_err(|err| AppError::Invalid(format!("the context did not start: {err}")))?;
        open.contexts.lock().insert(
            info.id.clone(),
            Entry {
                info: info.clone(),
                running: Some(running),
                ended: None,
            },
        );
        Ok(info)
    }

    /// Ends context `context` and forgets it; 409 while a cell runs in the session.
    pub async fn remove_context(
        &self,
        caller: &ApiKey,
        id: &str,
        context: &str,
    ) -> Result<(), AppError> {
        let open = self.context_session(caller, id).await?;
        let _guard = open.held.try_lock().map_err(|_| busy(id))?;
        let entry = open
            .contexts
            .lock()
            .remove(context)
            .ok_or_else(|| not_found(context))?;
        if let Some(running) = entry.running {
            running.close().await;
        }
        Ok(())
    }

    /// Restarts context `context`: a fresh interpreter, same id, language and cwd; its state
    /// is gone. Also brings back a context that ended under a cell.
    pub async fn restart_context(
        &self,
        caller: &ApiKey,
        id: &str,
        context: &str,
    ) -> Result<(), AppError> {
        let open = self.context_session(caller, id).await?;
        let mut guard = open.held.try_lock().map_err(|_| busy(id))?;
        let held = guard
            .as_mut()
            .ok_or_else(|| AppError::Conflict(format!("session {id} has no running sandbox")))?;
        let (info, old) = {
            let mut entries = open.contexts.lock();
            let entry = entries.get_mut(context).ok_or_else(|| not_found(context))?;
            entry.ended = Some("it is being restarted".to_owned());
            (entry.info.clone(), entry.running.take())
        };
        if let Some(old) = old {
            old.close().await;
        }
        let started = held
            .sandbox
            .open_context(info.runner, context_job(held, &info.cwd))
            .await;
        let mut entries = open.contexts.lock();
        let entry = entries.get_mut(context).ok_or_else(|| not_found(context))?;
        match started {
            Ok(running) => {
                entry.running = Some(running);
                entry.ended = None;
                Ok(())
            }
            Err(err) => {
                entry.ended = Some(format!("its restart failed: {err}"));
                Err(AppError::Internal(format!(
                    "restarting context {context}: {err}"
                )))
            }
        }
    }
}

fn busy(id: &str) -> AppError {
    AppError::Conflict(format!(
        "sandbox {id} is busy: code contexts change only between cells"
    ))
}

/// A context's opening line: the session's environment (its proxy settings included: the
/// session's bridge serves every context), the context's cwd, no files, no bridge of its own.
fn context_job(held: &super::sessions::Held, cwd: &str) -> Job<'static> {
    Job {
        argv: vec!["session".to_owned()],
        cwd: Some(cwd.to_owned()),
        env: Some(opening_env(held)),
        files: Vec::new(),
        proxy: None,
        exit_nonce: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwds_are_absolute_and_plain() {
        assert_eq!(checked_cwd("/home/user/x").unwrap(), "/home/user/x");
        for bad in ["relative", "/a/../b", "/a\nb", ""] {
            assert!(checked_cwd(bad).is_err(), "{bad:?}");
        }
    }
}
