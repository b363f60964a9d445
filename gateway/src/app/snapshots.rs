//! Pause and resume of a session (DESIGN 15; docs/snapshots.md). Pausing checkpoints an idle
//! session's sandbox into an image under the snapshots directory (0700, files 0600), records
//! the image's sha256, and releases everything the session held: container, egress grant and
//! socket, its slot and its share of `max_concurrent`. Resuming checks the sha256, restores the
//! image into a new container with a fresh egress socket directory serving the session's grant,
//! and holds it open again. A pause while an execution runs answers 409 (it never waits: the
//! caller chose to pause now, and a turn may run for minutes).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::json;
use sha2::{Digest, Sha256};

use super::floor::Runnable;
use super::home::SandboxHome;
use super::pool::Shape;
use super::reaper::LiveGuard;
use super::scheduler::Slot;
use super::sessions::{release, Held, SessionShare};
use super::{error_chain, App, AppError};
use crate::audit::events::{self, sessions as session_events};
use crate::audit::session_turns::TurnKind;
use crate::audit::sessions::SessionRow;
use crate::audit::snapshots::PauseRow;
use crate::audit::{ApiKey, NewEvent};
use crate::egress::{ExecutionEgress, Listen};
use crate::runtime::{Owner, SessionRunner, Waits};
use crate::session_wire::SessionStatus;
use egress_proxy::Inspection;

/// Paused sessions of this gateway: what a resume needs to restore each; the open sessions
/// that close, rather than pause, once idle; and the CA and placeholders each kept snapshot's
/// program holds (a fork serves them again: `Inspection::for_grant_carrying`).
#[derive(Debug, Default)]
pub struct PausedSessions {
    map: Mutex<HashMap<String, Paused>>,
    close_when_idle: Mutex<std::collections::HashSet<String>>,
    carried: Mutex<HashMap<String, Arc<Inspection>>>,
}

/// One paused session's image and what its sandbox was.
#[derive(Debug)]
pub(super) struct Paused {
    pub(super) image: PathBuf,
    pub(super) sha256: String,
    pub(super) bytes: u64,
    pub(super) runnable: Runnable,
    pub(super) language: String,
    pub(super) executions: u64,
    /// The CA and placeholders its program holds (with an inspected destination).
    pub(super) inspection: Option<Arc<Inspection>>,
}

impl PausedSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Paused>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn take(&self, id: &str) -> Option<Paused> {
        self.lock().remove(id)
    }

    pub(super) fn put(&self, id: &str, paused: Paused) {
        self.lock().insert(id.to_owned(), paused);
    }

    /// Notes what the session asked to become once idle (`idle_action`).
    pub(super) fn set_idle_action(&self, id: &str, pauses: bool) {
        let mut closing = self
            .close_when_idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if pauses {
            closing.remove(id);
        } else {
            closing.insert(id.to_owned());
        }
    }

    /// Forgets a closed session's pause and removes its image.
    pub(super) fn forget(&self, id: &str) {
        self.set_idle_action(id, true);
        if let Some(paused) = self.take(id) {
            remove_image(&paused.image);
        }
    }

    pub(super) fn closes_when_idle(&self, id: &str) -> bool {
        self.close_when_idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(id)
    }

    fn carried(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Inspection>>> {
        self.carried.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps what a kept snapshot's program holds, for its forks.
    pub(super) fn carry(&self, snapshot_id: &str, inspection: Option<Arc<Inspection>>) {
        if let Some(inspection) = inspection {
            self.carried().insert(snapshot_id.to_owned(), inspection);
        }
    }

    /// Whether the session is paused here, and if so whether its grant inspected anything.
    pub(super) fn inspected(&self, id: &str) -> Option<bool> {
        self.lock()
            .get(id)
            .map(|paused| paused.inspection.is_some())
    }

    pub(super) fn carried_by(&self, snapshot_id: &str) -> Option<Arc<Inspection>> {
        self.carried().get(snapshot_id).cloned()
    }

    pub(super) fn uncarry(&self, snapshot_id: &str) {
        self.carried().remove(snapshot_id);
    }
}

/// How long a request on a session its row says is paused waits for the pause (or another
/// request's resume) to let go of it, before it is answered busy.
const PAUSE_SETTLES: std::time::Duration = std::time::Duration::from_secs(30);

/// Marks a session as being paused for as long as it lives (see `OpenSession::pausing`).
struct Pausing<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> Pausing<'a> {
    fn begin(flag: &'a std::sync::atomic::AtomicBool) -> Pausing<'a> {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        Pausing(flag)
    }
}

impl Drop for Pausing<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whose session an event is about.
#[derive(Debug, Clone, Copy)]
pub(super) struct Whose<'a> {
    pub(super) id: &'a str,
    pub(super) tenant: &'a str,
    pub(super) key_id: &'a str,
}

impl<'a> From<&'a SessionRow> for Whose<'a> {
    fn from(row: &'a SessionRow) -> Whose<'a> {
        Whose {
            id: &row.id,
            tenant: &row.tenant,
            key_id: &row.key_id,
        }
    }
}

/// A session's places on this replica (see `sessions::Held`).
pub(super) type Places = (Slot, LiveGuard, SessionShare);

/// What a restore starts from, and what the restored session is.
pub(super) struct Restore<'a> {
    pub(super) id: &'a str,
    pub(super) tenant: &'a str,
    pub(super) image: &'a Path,
    pub(super) runnable: Runnable,
    pub(super) language: &'a str,
    pub(super) executions: u64,
    /// What the checkpointed program trusts and holds: its listener serves them again.
    pub(super) carried: Option<Arc<Inspection>>,
}

/// What a pause, a resume or a restore failed at.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshots are not enabled on this gateway (config `snapshots.enabled`)")]
    Disabled,
    #[error("preparing the snapshot directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the checkpoint image {path}: {source}")]
    Image {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the checkpoint image {path} does not match its recorded sha256 ({recorded}): it was changed on disk and is not restored")]
    Corrupt { path: PathBuf, recorded: String },
}

impl From<SnapshotError> for AppError {
    fn from(err: SnapshotError) -> AppError {
        match err {
            SnapshotError::Disabled | SnapshotError::Corrupt { .. } => {
                AppError::Conflict(err.to_string())
            }
            other => AppError::Internal(other.to_string()),
        }
    }
}

impl App {
    /// `POST /v1/sessions/{id}/pause`: checkpoints the idle session and releases its sandbox.
    pub async fn pause_session(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
    ) -> Result<SessionRow, AppError> {
        let row = self.get_session(caller, id).await?;
        if row.is(SessionStatus::Paused) {
            return Ok(row);
        }
        match self.session_held_elsewhere(caller, id).await? {
            // Its sandbox runs there: so does its checkpoint.
            Some(row) => {
                self.relay_session_step(caller, &row, TurnKind::Pause)
                    .await?;
            }
            None => self.pause_held(&row).await?,
        }
        self.get_session(caller, id).await
    }

    /// Pauses an open session of this gateway that runs nothing (409 while one runs).
    pub(super) async fn pause_held(&self, row: &SessionRow) -> Result<(), AppError> {
        let id = row.id.as_str();
        let dir = self.snapshot_dir(&row.tenant)?;
        let open = self.sessions.get(id).ok_or_else(|| not_open(row))?;
        // Set before the lock is tried, so a request that finds the lock taken knows it may be
        // this pause's (a running execution's holder makes such a request wait, bounded).
        let _pausing = Pausing::begin(&open.pausing);
        let Ok(mut guard) = open.held.try_lock() else {
            return Err(AppError::Conflict(format!(
                "session {id} is running an execution: pause it once that ended"
            )));
        };
        if open.runs_processes() {
            return Err(AppError::Conflict(format!(
                "session {id} is running a process: pause it once its processes ended"
            )));
        }
        let Some(held) = guard.as_mut() else {
            return Err(not_open(row));
        };
        // The checkpoint keeps the session's runner only: its code contexts end here.
        open.contexts.end_all("the sandbox was paused").await;
        let started = std::time::Instant::now();
        let image = dir.join(format!("{id}-{}", crate::ids::new("ck")));
        let (sha256, bytes) = checkpoint_complete(held, &image, &self.instance)
            .await
            .map_err(|err| checkpoint_failed(&format!("pausing session {id}"), &err))?;
        let inspection = held.egress.as_ref().and_then(ExecutionEgress::inspection);
        let paused = Paused {
            image,
            sha256: sha256.clone(),
            bytes,
            runnable: held.runnable.clone(),
            language: held.language.clone(),
            executions: held.executions,
            inspection,
        };
        let Some(held) = guard.take() else {
            return Err(not_open(row));
        };
        // The container goes before the row says `paused`: a paused session holds none.
        release(held).await;
        self.session_cursors.close(id);
        let stored = self.store_pause(id, &paused).await;
        // Held in memory either way, before the session is let go: its next execution (which
        // waits for this: `PAUSE_SETTLES`) restores it; unstored, it does not survive a restart.
        self.sessions.paused.put(id, paused);
        drop(guard);
        stored?;
        let took_ms = started.elapsed().as_millis();
        let detail = events::column(&session_events::Paused {
            bytes,
            sha256,
            took_ms,
        });
        self.record_session_step(row.into(), api_types::EventKind::SessionPaused, detail)
            .await;
        Ok(())
    }

    /// The session's row says `paused` and its checkpoint is stored with it, in one
    /// transaction (a restarted gateway serves it from there).
    pub(super) async fn store_pause(&self, id: &str, paused: &Paused) -> Result<(), AppError> {
        let row = PauseRow {
            session_id: id.to_owned(),
            image: paused.image.to_string_lossy().into_owned(),
            sha256: paused.sha256.clone(),
            bytes: i64::try_from(paused.bytes).unwrap_or(i64::MAX),
            runnable: sqlx::types::Json(json!(paused.runnable)),
            language: paused.language.clone(),
            executions: i64::try_from(paused.executions).unwrap_or(i64::MAX),
            inspected: paused.inspection.is_some(),
            closes_when_idle: self.sessions.paused.closes_when_idle(id),
        };
        Ok(self.audit.store_pause(&row).await?)
    }

    /// `POST /v1/sessions/{id}/resume`: restores a paused session (a running one is answered
    /// as it is).
    pub async fn resume_session(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
    ) -> Result<SessionRow, AppError> {
        let row = match self.session_relayed_or_taken(caller, id).await? {
            Some(row) if row.is(SessionStatus::Paused) => {
                // Its image is not readable here (`snapshots.dir` not shared): its replica
                // restores it.
                self.relay_session_step(caller, &row, TurnKind::Resume)
                    .await?;
                return self.get_session(caller, id).await;
            }
            Some(row) => return Ok(row),
            None => self.get_session(caller, id).await?,
        };
        self.resume_paused(&row).await?;
        self.get_session(caller, id).await
    }

    /// Restores the session if it is paused here; says whether it was.
    pub(super) async fn resume_paused(&self, row: &SessionRow) -> Result<bool, AppError> {
        let id = row.id.as_str();
        let Some(open) = self.sessions.get(id) else {
            return Ok(false);
        };
        let mut guard = if row.is(SessionStatus::Paused) {
            // Its pause stores the row before it lets go of the session (or another request is
            // restoring it): wait for that, bounded, rather than answer busy.
            match tokio::time::timeout(PAUSE_SETTLES, open.held.lock()).await {
                Ok(guard) => guard,
                Err(_) => return Ok(false),
            }
        } else {
            match open.held.try_lock() {
                Ok(guard) => guard,
                // A pause (an idle one, say) holds it: its row says paused only once it is
                // done, so wait for it, bounded, and restore, rather than answer busy.
                Err(_) if open.pausing.load(std::sync::atomic::Ordering::SeqCst) => {
                    match tokio::time::timeout(PAUSE_SETTLES, open.held.lock()).await {
                        Ok(guard) => guard,
                        Err(_) => return Ok(false),
                    }
                }
                // Busy means running, so not paused: the caller's own `try_lock` answers 409
                // (waiting here would queue a second execution behind the first).
                Err(_) => return Ok(false),
            }
        };
        if guard.is_some() {
            return Ok(false);
        }
        let Some(paused) = self.sessions.paused.take(id) else {
            return Ok(false);
        };
        // The restore is this replica's alone: another one may be asked at the same moment.
        let (from, claimed) = match self.claim_restore(id).await {
            Ok(Some(claim)) => claim,
            Ok(None) => {
                drop(guard);
                self.let_go(id);
                return Err(AppError::Conflict(format!(
                    "session {id} is no longer paused on this replica (another replica resumed \
                     it, or it closed): ask again"
                )));
            }
            Err(err) => {
                self.sessions.paused.put(id, paused);
                return Err(err);
            }
        };
        let paused = match self
            .claimed_paused(id, paused, (&from, claimed.as_ref()))
            .await
        {
            Ok(paused) => paused,
            Err(err) => {
                drop(guard);
                return Err(err);
            }
        };
        let began = std::time::Instant::now();
        let mut check_ms = 0;
        match self.restore_held(row, &paused, &mut check_ms).await {
            Ok(held) => {
                *guard = Some(held);
                drop(guard);
                remove_image(&paused.image);
                self.audit
                    .set_session_status(id, SessionStatus::Ready, false)
                    .await?;
                self.audit.forget_pause(id).await?;
                self.moved_from(id, &from).await;
                // Where a resume's time goes (`make bench`, the snapshots bench), and where.
                let detail = events::column(&session_events::Resumed {
                    sha256: paused.sha256.clone(),
                    bytes: paused.bytes,
                    restore_ms: began.elapsed().as_millis(),
                    check_ms,
                    replica: self.instance.clone(),
                    paused_on: from,
                });
                self.record_session_step(row.into(), api_types::EventKind::SessionResumed, detail)
                    .await;
                Ok(true)
            }
            Err(err) => {
                // Paused again, and this replica's now: the row it claimed stored again (for a
                // restart or a takeover), and what it restores from next.
                let stored = match &claimed {
                    Some(claimed) => self.audit.store_pause(claimed).await.map_err(Into::into),
                    None => self.store_pause(id, &paused).await,
                };
                if let Err(stored) = stored {
                    tracing::error!(session_id = %id, error = %stored, "a pause not restored was not stored again");
                }
                self.sessions.paused.put(id, paused);
                Err(err)
            }
        }
    }

    /// A new sandbox restored from the paused image, with the session's places (slot, share,
    /// live entry) taken again.
    async fn restore_held(
        &self,
        row: &SessionRow,
        paused: &Paused,
        check_ms: &mut u128,
    ) -> Result<Held, AppError> {
        let checking = std::time::Instant::now();
        self.check_image_of(row.into(), &paused.image, &paused.sha256)
            .await?;
        *check_ms = checking.elapsed().as_millis();
        let places = self.take_places(&row.id, &row.tenant).await?;
        let restore = Restore {
            id: &row.id,
            tenant: &row.tenant,
            image: &paused.image,
            runnable: paused.runnable.clone(),
            language: &paused.language,
            executions: paused.executions,
            carried: paused.inspection.clone(),
        };
        self.restore_sandbox(restore, places).await
    }

    /// Refuses (and audits, `snapshot.corrupt`) an image whose bytes changed since written.
    pub(super) async fn check_image_of(
        &self,
        who: Whose<'_>,
        image: &Path,
        sha256: &str,
    ) -> Result<(), AppError> {
        match check_image(image, sha256) {
            Ok(()) => Ok(()),
            Err(err) => {
                if matches!(err, SnapshotError::Corrupt { .. }) {
                    let detail = events::column(&session_events::Corrupt {
                        sha256: sha256.to_owned(),
                        refused: session_events::CorruptUse::Restore,
                    });
                    self.record_session_step(who, api_types::EventKind::SnapshotCorrupt, detail)
                        .await;
                }
                Err(err.into())
            }
        }
    }

    /// A session's places on this replica: its share, a scheduler slot, its live entry.
    pub(super) async fn take_places(&self, id: &str, tenant: &str) -> Result<Places, AppError> {
        let share = self.session_share()?;
        let ticket = self
            .scheduler
            .admit(tenant)
            .map_err(|full| AppError::RateLimited(full.to_string()))?;
        let slot = ticket
            .slot()
            .await
            .ok_or_else(|| AppError::Internal("the gateway is shutting down".into()))?;
        Ok((slot, self.live.track(id), share))
    }

    /// A new sandbox restored from `image`: new directories, the grant served on a fresh
    /// socket before it runs again (its first connection may come at once).
    pub(super) async fn restore_sandbox(
        &self,
        restore: Restore<'_>,
        (slot, live, share): Places,
    ) -> Result<Held, AppError> {
        let id = restore.id;
        let unavailable = |what: &str, err: &dyn std::fmt::Display| {
            AppError::Internal(format!("restoring session {id}: {what}: {err}"))
        };
        let runner = SessionRunner::for_language(restore.language)
            .ok_or_else(|| unavailable("its runner", &restore.language))?;
        let shape = Shape::of(&restore.runnable);
        let home = SandboxHome::create(
            &self.egress_root,
            &self.scratch_root,
            id,
            shape.limits.disk_mb,
        )
        .map_err(|err| unavailable("its directories", &err))?;
        let mut plan = self.plan(
            id,
            Owner::Execution(id.to_owned()),
            &shape,
            &home,
            Waits::Session(runner),
        );
        plan.mounts.clone_from(&restore.runnable.mounts);
        let egress = match self.serve_restored_grant(&restore, &home) {
            Ok(egress) => egress,
            Err(err) => {
                home.remove();
                return Err(unavailable("its egress grant", &err));
            }
        };
        let sandbox = match self.runtime.restore(plan, restore.image).await {
            Ok(sandbox) => sandbox,
            Err(err) => {
                if let Some(egress) = egress {
                    egress.finish().await;
                }
                home.remove();
                self.session_cursors.close(id);
                return Err(unavailable("the sandbox", &error_chain(&err)));
            }
        };
        Ok(Held {
            sandbox,
            home,
            egress,
            runnable: restore.runnable,
            language: restore.language.to_owned(),
            executions: restore.executions,
            _slot: slot,
            _live: live,
            _share: share,
            start: super::launch::Start::Restored,
        })
    }

    /// The restored sandbox's grant on the fresh socket in its new egress directory.
    fn serve_restored_grant(
        &self,
        restore: &Restore<'_>,
        home: &SandboxHome,
    ) -> Result<Option<ExecutionEgress>, String> {
        let Some(proxy) = self.egress.as_ref() else {
            return Ok(None);
        };
        self.session_cursors.open(restore.id);
        let listen = Listen {
            dir: &home.egress_dir,
            execution_id: restore.id,
            tenant: restore.tenant,
            grant: restore.runnable.network.as_ref(),
        };
        ExecutionEgress::start_carrying(
            proxy,
            &listen,
            restore.carried.as_deref(),
            self.shutdown.child_token(),
        )
        .map(Some)
        .map_err(|err| {
            self.session_cursors.close(restore.id);
            error_chain(&err)
        })
    }

    /// Whether the session pauses (`idle_action`) rather than closes once idle.
    pub(super) fn idle_pauses(&self, request: &crate::session_wire::SessionRequest) -> bool {
        use crate::session_wire::IdleAction;
        match request.idle_action {
            Some(IdleAction::Pause) => true,
            Some(IdleAction::Close) => false,
            None => self.config.snapshots.enabled,
        }
    }

    /// The idle watcher's seam: pauses an idle session that pauses rather than closes; `true`
    /// when it is (now, or already) paused, so the watcher keeps it and watches on.
    pub(super) async fn pause_when_idle(&self, id: &str) -> bool {
        let closes = self.sessions.paused.closes_when_idle(id);
        if closes || !self.config.snapshots.enabled {
            return false;
        }
        if self.sessions.paused.lock().contains_key(id) {
            return true;
        }
        let row = match self.audit.get_session(id).await {
            Ok(Some(row)) => row,
            _ => return false,
        };
        if row.is(SessionStatus::Busy) {
            // Not idle after all: an execution started as the clock ran out.
            return true;
        }
        match self.pause_held(&row).await {
            Ok(()) => true,
            // An execution holds it: it is not idle, and its end starts the clock again.
            Err(AppError::Conflict(_)) if self.sessions.get(id).is_some() => true,
            Err(err) => {
                tracing::warn!(session_id = %id, error = %err, "idle session not paused: it closes");
                false
            }
        }
    }

    /// The record of an execution that restored its paused session says so.
    pub(super) async fn said_resumed(
        &self,
        mut record: crate::audit::ExecutionRow,
        resumed: bool,
    ) -> crate::audit::ExecutionRow {
        if resumed {
            if let Err(err) = self.audit.mark_resumed(&record.id).await {
                tracing::error!(execution_id = %record.id, error = %err, "`resumed` not recorded");
            }
            record.resumed = true;
        }
        record
    }

    /// The tenant's directory of checkpoint images (0700), created on first use.
    pub(super) fn snapshot_dir(&self, tenant: &str) -> Result<PathBuf, SnapshotError> {
        let root = self.snapshot_root().ok_or(SnapshotError::Disabled)?;
        let dir = root.join(hex::encode(tenant.as_bytes()));
        for path in [&root, &dir] {
            private_dir(path).map_err(|source| SnapshotError::Directory {
                path: path.clone(),
                source,
            })?;
        }
        Ok(dir)
    }

    /// The snapshots directory, with snapshots enabled.
    pub(super) fn snapshot_root(&self) -> Option<PathBuf> {
        let config = &self.config.snapshots;
        config.enabled.then(|| {
            config
                .dir
                .clone()
                .unwrap_or_else(|| self.config.data_dir.join("snapshots"))
        })
    }

    pub(super) async fn record_session_step(
        &self,
        who: Whose<'_>,
        kind: api_types::EventKind,
        detail: serde_json::Value,
    ) {
        let event = NewEvent {
            kind,
            execution_id: None,
            key_id: Some(who.key_id.to_owned()),
            tenant: Some(who.tenant.to_owned()),
            decision_id: None,
            allow: None,
            reasons: events::no_reasons(),
            input: events::column(&session_events::SessionRef {
                session_id: who.id.to_owned(),
            }),
            decision: detail,
            policy_revision: None,
        };
        if let Err(err) = self.audit.record_event(&event).await {
            tracing::error!(session_id = %who.id, error = %err, kind = kind.as_str(), "session event not recorded");
        }
    }
}

/// Checkpoints the sandbox into `image`, complete or not at all: dockerd writes it under a
/// `.partial` name that is renamed to `image` only once its digest is taken, so a failure (a
/// full disk, a killed gateway) never leaves an image a restore would take.
pub(super) async fn checkpoint_complete(
    held: &mut Held,
    image: &Path,
    instance: &str,
) -> Result<(String, u64), CheckpointError> {
    let partial = partial_path(image, instance);
    let written = async {
        held.sandbox
            .checkpoint(&partial)
            .await
            .map_err(|err| match err {
                crate::runtime::RuntimeError::NoRoom { .. } => {
                    CheckpointError::NoRoom(err.to_string())
                }
                other => CheckpointError::Checkpoint(error_chain(&other)),
            })?;
        let digest = image_digest(&partial).map_err(CheckpointError::Image)?;
        std::fs::rename(&partial, image).map_err(|source| {
            CheckpointError::Image(SnapshotError::Image {
                path: image.to_owned(),
                source,
            })
        })?;
        Ok(digest)
    };
    let done = written.await;
    if done.is_err() {
        remove_image(&partial);
        remove_image(image);
    }
    done
}

/// A checkpoint that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Refused before anything was written: the sandbox runs on.
    #[error("{0}")]
    NoRoom(String),
    /// runsc stops the sandbox when it fails part-way.
    #[error(
        "checkpointing the sandbox: {0}; nothing was kept, and the sandbox may not have survived \
         it (its next execution says)"
    )]
    Checkpoint(String),
    #[error(transparent)]
    Image(SnapshotError),
}

/// Where an image is written before it is complete: named after the writing instance, whose
/// next start removes it (`sweep_partial_images`; replicas may share the directory).
fn partial_path(image: &Path, instance: &str) -> PathBuf {
    let mut name = image.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{instance}{PARTIAL_SUFFIX}"));
    image.with_file_name(name)
}

/// The suffix of an image still being written.
pub(super) const PARTIAL_SUFFIX: &str = ".partial";

/// A checkpoint that failed (a full disk, dockerd refusing) is the server's condition, shown
/// with its cause (503: `AppError::ReplicaUnavailable` is the one 503 carrying its message).
pub(super) fn checkpoint_failed(what: &str, err: &CheckpointError) -> AppError {
    let outcome = match err {
        CheckpointError::NoRoom(_) => "failed and the session goes on running",
        // The checkpoint had stopped the sandbox before its image was found wanting.
        CheckpointError::Image(_) => {
            "failed after the sandbox was checkpointed: nothing was kept, and the sandbox may \
             not have survived it (its next execution says)"
        }
        CheckpointError::Checkpoint(_) => "failed",
    };
    AppError::ReplicaUnavailable(format!("{what} {outcome}: {err}"))
}

fn not_open(row: &SessionRow) -> AppError {
    AppError::Conflict(format!(
        "session {} is {} and not open on this gateway: nothing to pause",
        row.id,
        row.status.as_str()
    ))
}

/// A directory only the gateway's user may enter.
fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

/// The sha256 over the image's files (sorted by name: each name, its length, its bytes) and
/// their total size.
pub fn image_digest(image: &Path) -> Result<(String, u64), SnapshotError> {
    let failed = |source| SnapshotError::Image {
        path: image.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(image).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if entry.file_type().map_err(failed)?.is_file() {
            names.push(entry.file_name());
        }
    }
    names.sort();
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    let mut buffer = vec![0u8; 1 << 20];
    for name in names {
        let path = image.join(&name);
        let len = std::fs::metadata(&path).map_err(failed)?.len();
        hasher.update(name.as_encoded_bytes());
        hasher.update(len.to_be_bytes());
        let mut file = std::fs::File::open(&path).map_err(failed)?;
        loop {
            let read = file.read(&mut buffer).map_err(failed)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        bytes += len;
    }
    Ok((hex::encode(hasher.finalize()), bytes))
}

/// Refuses an image whose bytes are not the ones recorded when it was written.
pub(super) fn check_image(image: &Path, recorded: &str) -> Result<(), SnapshotError> {
    let (actual, _) = image_digest(image)?;
    if actual == recorded {
        return Ok(());
    }
    Err(SnapshotError::Corrupt {
        path: image.to_owned(),
        recorded: recorded.to_owned(),
    })
}

pub(super) fn remove_image(image: &Path) {
    if let Err(err) = std::fs::remove_dir_all(image) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(image = %image.display(), error = %err, "checkpoint image left behind");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_changes_the_digest_and_the_check_refuses_it() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("img");
        std::fs::create_dir(&image).unwrap();
        std::fs::write(image.join("checkpoint.img"), b"memory of the program").unwrap();
        let (digest, bytes) = image_digest(&image).unwrap();
        assert_eq!(bytes, 21);
        check_image(&image, &digest).unwrap();
        std::fs::write(image.join("checkpoint.img"), b"memory of the pregram").unwrap();
        assert!(matches!(
            check_image(&image, &digest),
            Err(SnapshotError::Corrupt { .. })
        ));
    }
}
