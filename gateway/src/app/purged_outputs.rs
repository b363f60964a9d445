//! Output files of executions another replica purged. The retention purge runs on
//! whichever replica sweeps first, but the collected files of an execution live on the disk of
//! the replica that ran it. The purging replica announces the ids ([`PURGED`]); each replica
//! removes its own files of those whose records are purged (asked of the database, not taken
//! from the message). A lost message is made up for by [`App::sweep_purged_outputs`], which
//! walks this replica's purged records in purge order from where it last stopped (from the
//! start after a restart).

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::App;

/// "These executions were purged".
pub const PURGED: &str = "sandgate_purged";
/// Ids per message: well under the 8000-byte payload limit.
const IDS_PER_MESSAGE: usize = 100;
/// Purged records read per page, and pages per sweep (the next sweep goes on).
const PAGE: i64 = 500;
const PAGES_PER_SWEEP: usize = 10;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Purged {
    executions: Vec<String>,
    by: String,
}

/// Where this replica's sweep of purged records stopped: `(purged_at, id)` of the last one.
#[derive(Debug, Default)]
pub struct SweptTo(Mutex<Option<(DateTime<Utc>, String)>>);

impl SweptTo {
    fn get(&self) -> Option<(DateTime<Utc>, String)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, to: (DateTime<Utc>, String)) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(to);
    }
}

impl App {
    /// Tells every replica that `ids` were purged (after the purge committed).
    pub(super) async fn announce_purge(&self, ids: &[String]) {
        for chunk in ids.chunks(IDS_PER_MESSAGE) {
            let message = Purged {
                executions: chunk.to_vec(),
                by: self.instance.clone(),
            };
            let payload = serde_json::to_string(&message).unwrap_or_default();
            if let Err(err) = self.audit.notify(PURGED, &payload).await {
                tracing::warn!(error = %super::error_chain(&err), "could not announce a purge to other replicas");
                return;
            }
        }
    }

    /// Another replica purged: remove this replica's files of those records.
    pub(super) fn purged_elsewhere(self: &Arc<Self>, message: Purged) {
        if message.by == self.instance {
            return;
        }
        let app = Arc::clone(self);
        self.tasks.spawn(async move {
            match app
                .audit
                .purged_among(&app.instance, &message.executions)
                .await
            {
                Ok(ids) => app.remove_collected(ids).await,
                Err(err) => tracing::warn!(error = %err, "cannot check purged records"),
            }
        });
    }

    /// Removes the collected files of this replica's purged records it has not swept yet.
    pub async fn sweep_purged_outputs(&self) {
        for _ in 0..PAGES_PER_SWEEP {
            let after = self.replicas.swept_to.get();
            let page = match self
                .audit
                .purged_since(&self.instance, after.as_ref(), PAGE)
                .await
            {
                Ok(page) => page,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot list purged records");
                    return;
                }
            };
            let Some(last) = page.last().cloned() else {
                return;
            };
            let full = page.len() == usize::try_from(PAGE).unwrap_or(usize::MAX);
            self.remove_collected(page.into_iter().map(|(_, id)| id).collect())
                .await;
            self.replicas.swept_to.set(last);
            if !full {
                return;
            }
        }
    }

    async fn remove_collected(&self, ids: Vec<String>) {
        let root = self.outputs_root.clone();
        let removed = tokio::task::spawn_blocking(move || {
            ids.iter()
                .filter(|id| match std::fs::remove_dir_all(root.join(id)) {
                    Ok(()) => true,
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => false,
                    Err(err) => {
                        tracing::warn!(execution_id = %id, error = %err, "could not remove purged outputs");
                        false
                    }
                })
                .count()
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            tracing::info!(
                executions = removed,
                "collected files of purged records removed"
            );
        }
    }
}
