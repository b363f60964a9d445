//! Paused sessions across a restart of the gateway (DESIGN 15, issue 24 item 3;
//! docs/snapshots.md "Graceful stop and restart"). A graceful stop pauses the open sessions that
//! run nothing and may be paused; the checkpoints are stored with the sessions
//! (`session_pauses`), and the restarted gateway (the same instance) serves them again before
//! its first sweep closes the rest. Half-written images of this instance are removed at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::floor::Runnable;
use super::snapshots::{remove_image, Paused, PARTIAL_SUFFIX};
use super::App;
use crate::audit::sessions::SessionRow;
use crate::audit::snapshots::PauseRow;
use crate::egress::ExecutionEgress;

impl App {
    /// A graceful stop's end of an open session (its watcher, as the gateway shuts down):
    /// one paused, or idle and pausable, is kept paused for the restarted gateway (DESIGN 15);
    /// any other is closed `gateway_restart`.
    pub(super) async fn stop_session(&self, id: &str) {
        if !self.kept_over_restart(id).await {
            self.close_session(id, crate::session_wire::ClosedReason::GatewayRestart)
                .await;
        }
    }

    /// Whether the session stays paused across the restart: snapshots on, `idle_action`
    /// pause, nothing running, and no inspected destination (its CA's key cannot outlive this
    /// process: docs/snapshots.md).
    async fn kept_over_restart(&self, id: &str) -> bool {
        if !self.config.snapshots.enabled || self.sessions.paused.closes_when_idle(id) {
            return false;
        }
        if let Some(inspected) = self.sessions.paused.inspected(id) {
            return !inspected;
        }
        let Some(open) = self.sessions.get(id) else {
            return false;
        };
        {
            let Ok(guard) = open.held.try_lock() else {
                return false;
            };
            let inspects = guard
                .as_ref()
                .and_then(|held| held.egress.as_ref())
                .and_then(ExecutionEgress::inspection)
                .is_some();
            if guard.is_none() || inspects {
                return false;
            }
        }
        let row = match self.audit.get_session(id).await {
            Ok(Some(row)) => row,
            _ => return false,
        };
        match self.pause_held(&row).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(session_id = %id, error = %err, "session not paused at shutdown: it closes");
                false
            }
        }
    }

    /// At start-up, before the first sweep closes what a previous run left: serves again the
    /// sessions it left paused (their checkpoints stored with them), and forgets those it
    /// cannot restore (they are closed `gateway_restart` with the rest). Removes images a
    /// checkpoint of this instance left half-written.
    pub async fn adopt_paused_sessions(self: &Arc<Self>) {
        self.sweep_partial_images();
        let left = match self.audit.pauses_left(&self.instance).await {
            Ok(left) => left,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the paused sessions left by a restart");
                return;
            }
        };
        for (row, pause) in left {
            match self.adoptable(&pause) {
                Ok(paused) => self.adopt(&row, &pause, paused),
                Err(why) => {
                    tracing::warn!(session_id = %row.id, why, "paused session not served after the restart: it closes");
                    remove_image(Path::new(&pause.image));
                    if let Err(err) = self.audit.forget_pause(&row.id).await {
                        tracing::warn!(session_id = %row.id, error = %err, "pause not forgotten");
                    }
                }
            }
        }
    }

    pub(super) fn adoptable(&self, pause: &PauseRow) -> Result<Paused, &'static str> {
        if !self.config.snapshots.enabled {
            return Err("snapshots are disabled");
        }
        if pause.inspected {
            return Err("its grant inspected a destination (its CA's key ended with the process)");
        }
        if !Path::new(&pause.image).is_dir() {
            return Err("its image is gone");
        }
        let runnable: Runnable = serde_json::from_value(pause.runnable.0.clone())
            .map_err(|_| "its stored floor does not read")?;
        Ok(Paused {
            image: PathBuf::from(&pause.image),
            sha256: pause.sha256.clone(),
            bytes: u64::try_from(pause.bytes).unwrap_or(0),
            runnable,
            language: pause.language.clone(),
            executions: u64::try_from(pause.executions).unwrap_or(0),
            inspection: None,
        })
    }

    pub(super) fn adopt(self: &Arc<Self>, row: &SessionRow, pause: &PauseRow, paused: Paused) {
        if pause.session_id != row.id {
            // Another session's checkpoint (another tenant's memory): never served as this one.
            tracing::error!(session_id = %row.id, pause_of = %pause.session_id, "refused to adopt a session with another session's pause");
            return;
        }
        let id = row.id.clone();
        self.sessions.paused.put(&id, paused);
        self.sessions
            .paused
            .set_idle_action(&id, !pause.closes_when_idle);
        let idle = u64::try_from(row.idle_timeout_s).unwrap_or(1);
        let left = (row.expires_at - chrono::Utc::now()).num_seconds();
        let ttl = u64::try_from(left).unwrap_or(0).max(1);
        tracing::info!(session_id = %id, "paused session served by this replica");
        self.keep_registered(id, None, (idle, ttl));
    }

    /// Removes the `.partial` images of this instance under the snapshots directory: a
    /// checkpoint the previous run did not finish (a killed gateway, a full disk).
    fn sweep_partial_images(&self) {
        let Some(root) = self.snapshot_root() else {
            return;
        };
        let Ok(tenants) = std::fs::read_dir(&root) else {
            return;
        };
        let suffix = format!(".{}{PARTIAL_SUFFIX}", self.instance);
        for tenant in tenants.flatten() {
            let Ok(images) = std::fs::read_dir(tenant.path()) else {
                continue;
            };
            for image in images.flatten() {
                if image.file_name().to_string_lossy().ends_with(&suffix) {
                    tracing::warn!(image = %image.path().display(), "removing a half-written checkpoint image");
                    remove_image(&image.path());
                }
            }
        }
    }
}
