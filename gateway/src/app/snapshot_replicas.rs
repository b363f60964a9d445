//! Paused sessions on every replica (issue 24 item 7; docs/snapshots.md "Replicas"). A paused
//! session holds no sandbox: its checkpoint image lies under `snapshots.dir`, which the replicas
//! of one machine can read (a shared directory, or each one's own on the same disk). So the
//! replica asked to restore it (`/resume`, an execution, a snapshot) restores it itself and
//! becomes its owner, instead of relaying to the replica that paused it: the restore then works
//! the same whether that replica lives or died, and needs no round trip through it. The claim is
//! atomic in PostgreSQL (`audit::pause_claims`): exactly one replica restores each pause. The
//! replica that let go is told ([`MOVED`]) and forgets the session without closing it. A
//! replica whose lease expired has its paused sessions adopted by a survivor that can read their
//! images, rather than closed. What needs the running sandbox (pause, a snapshot of a running
//! session) is relayed to the replica that runs it (`app::session_relay`), as is a resume whose
//! image this replica cannot read.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::snapshots::Paused;
use super::{App, AppError};
use crate::audit::sessions::SessionRow;
use crate::audit::snapshots::PauseRow;
use crate::audit::ApiKey;
use crate::session_wire::SessionStatus;

/// "The paused session you held is restored by another replica: forget it".
pub const MOVED: &str = "sandgate_session_moved";

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Moved {
    session: String,
    /// The replica that held it.
    to: String,
    by: String,
}

impl App {
    /// The session's row when its request goes to the replica holding it; `None` when this
    /// replica serves it: it holds it, it is closed, or it is paused on another replica with an
    /// image readable here (then it is registered here, and the caller's resume claims it).
    pub(super) async fn session_relayed_or_taken(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
    ) -> Result<Option<SessionRow>, AppError> {
        let Some(row) = self.session_held_elsewhere(caller, id).await? else {
            return Ok(None);
        };
        if row.is(SessionStatus::Paused) && self.take_over(&row).await? {
            return Ok(None);
        }
        Ok(Some(row))
    }

    /// Registers another replica's paused session here when this replica can restore it.
    async fn take_over(self: &Arc<Self>, row: &SessionRow) -> Result<bool, AppError> {
        if !self.config.snapshots.enabled {
            return Ok(false);
        }
        let Some(pause) = self.audit.get_pause(&row.id).await? else {
            // Being restored somewhere (or not stored): its replica answers.
            return Ok(false);
        };
        match self.adoptable(&pause) {
            Ok(paused) => {
                self.adopt(row, &pause, paused);
                Ok(true)
            }
            Err(why) => {
                tracing::info!(session_id = %row.id, owner = %row.instance, why, "paused session not restorable here: relayed to its replica");
                Ok(false)
            }
        }
    }

    /// Claims the paused session for this replica's restore: the replica that held it and the
    /// pause row claimed, or `None` when another replica restored it first (or it closed). A
    /// pause this replica made but could not store (no row to claim) is its own: no row.
    pub(super) async fn claim_restore(
        &self,
        id: &str,
    ) -> Result<Option<(String, Option<PauseRow>)>, AppError> {
        let lease = self.config.lease_ms;
        if let Some(claimed) = self.audit.claim_pause(id, &self.instance, lease).await? {
            return Ok(Some((claimed.from, Some(claimed.pause))));
        }
        let row = self.audit.get_session(id).await?;
        let unstored =
            row.is_some_and(|row| row.is(SessionStatus::Paused) && row.instance == self.instance);
        Ok(unstored.then(|| (self.instance.clone(), None)))
    }

    /// What a resume restores: the pause row it claimed, never a stale copy held in memory (a
    /// takeover never claimed, a missed [`MOVED`]); the copy in memory only when it is that
    /// same checkpoint (it carries the inspected grant's CA) or no row was stored. A claimed
    /// row not restorable here goes back to the replica that held it.
    pub(super) async fn claimed_paused(
        &self,
        id: &str,
        held: Paused,
        (from, claimed): (&str, Option<&PauseRow>),
    ) -> Result<Paused, AppError> {
        let Some(claimed) = claimed else {
            return Ok(held);
        };
        if claimed.session_id != id {
            return Err(AppError::Internal(format!(
                "session {id} claimed the pause of session {}",
                claimed.session_id
            )));
        }
        if Path::new(&claimed.image) == held.image && claimed.sha256 == held.sha256 {
            return Ok(held);
        }
        match self.adoptable(claimed) {
            Ok(paused) => {
                self.sessions
                    .paused
                    .set_idle_action(id, !claimed.closes_when_idle);
                Ok(paused)
            }
            Err(why) => {
                self.audit.unclaim_pause(claimed, from).await?;
                self.let_go(id);
                Err(AppError::Conflict(format!(
                    "session {id} is paused on replica {from} ({why} here): ask again"
                )))
            }
        }
    }

    /// Forgets a paused session another replica took, without closing it or removing its
    /// image (that replica restores it).
    pub(super) fn let_go(&self, id: &str) {
        if let Some(open) = self.sessions.remove(id) {
            open.closing.cancel();
        }
        drop(self.sessions.paused.take(id));
        self.sessions.paused.set_idle_action(id, true);
        tracing::info!(session_id = %id, "paused session taken over by another replica");
    }

    /// Tells the replica a restored session was paused on that it is this one's now.
    pub(super) async fn moved_from(&self, id: &str, from: &str) {
        if from == self.instance {
            return;
        }
        let message = Moved {
            session: id.to_owned(),
            to: from.to_owned(),
            by: self.instance.clone(),
        };
        let payload = serde_json::to_string(&message).unwrap_or_default();
        if let Err(err) = self.audit.notify(MOVED, &payload).await {
            tracing::warn!(session_id = %id, error = %err, "could not tell the replica that paused it");
        }
    }

    /// A [`MOVED`] message: forgets the session if it is paused here (a session this replica
    /// runs, or is restoring, is not touched: its own claim decides).
    pub(super) fn session_moved(&self, message: Moved) {
        if message.to != self.instance {
            return;
        }
        let Some(open) = self.sessions.get(&message.session) else {
            return;
        };
        let paused = open.held.try_lock().is_ok_and(|held| held.is_none());
        if paused {
            tracing::info!(session_id = %message.session, by = %message.by, "paused session restored by another replica");
            self.let_go(&message.session);
        }
    }

    /// Adopts the paused sessions of replicas whose lease expired whose images this replica
    /// reads (before `close_expired` would close them): they are served here from now on.
    pub(super) async fn adopt_orphaned_pauses(self: &Arc<Self>) {
        if !self.config.snapshots.enabled {
            return;
        }
        let lease = self.config.lease_ms;
        let adopted = self
            .audit
            .adopt_expired_pauses(&self.instance, lease, |pause| self.adoptable(pause).is_ok())
            .await;
        let adopted = match adopted {
            Ok(adopted) => adopted,
            Err(err) => {
                tracing::warn!(error = %err, "cannot adopt the paused sessions of a dead replica");
                return;
            }
        };
        for (row, pause) in adopted {
            if let Ok(paused) = self.adoptable(&pause) {
                tracing::warn!(session_id = %row.id, owner = %row.instance, "adopted a paused session of a replica whose lease expired");
                self.adopt(&row, &pause, paused);
                // Its replica may live on (a lease lapsed under load): it forgets the session.
                self.moved_from(&row.id, &row.instance).await;
            }
        }
    }
}
