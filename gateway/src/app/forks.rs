//! Snapshots kept on disk and the sessions forked from them (DESIGN 15). A snapshot checkpoints
//! a session that runs nothing (the checkpoint stops its sandbox: runsc cannot leave it
//! running) and restores the session at once from the image it just wrote, keeping its places.
//! `POST /v1/sessions {"from_snapshot"}` restores a NEW session from a kept image: decided
//! afresh by the policy (`request.from_snapshot`), with the new decision's grant on a fresh
//! socket; every restore copies the image into its own container, so forks share nothing
//! writable. The sha256 recorded with the image (and in the chain) is checked before every
//! restore.

use std::path::{Path, PathBuf};

use chrono::Duration as ChronoDuration;
use serde_json::json;
use sqlx::types::Json;

use policy_engine::SnapshotInput;

use super::floor::Runnable;
use super::sessions::{Held, SessionRequest};
use super::snapshots::{
    checkpoint_complete, checkpoint_failed, remove_image, Places, Restore, Whose,
};
use super::{App, AppError};
use crate::audit::events;
use crate::audit::events::snapshots::{Snapshot, SnapshotOf};
use crate::audit::session_turns::TurnKind;
use crate::audit::sessions::SessionRow;
use crate::audit::snapshots::SnapshotRow;
use crate::audit::{ApiKey, NewEvent};
use crate::role::Role;
use crate::session_wire::ClosedReason;

/// A checkpoint just written for a kept snapshot.
struct Taken<'a> {
    id: &'a str,
    image: &'a Path,
    digest: (String, u64),
    mounts: Vec<crate::runtime::ReadOnlyMount>,
    inspected: bool,
}

impl SnapshotRow {
    /// `request.from_snapshot` of a session restored from it.
    pub fn policy_input(&self) -> SnapshotInput {
        SnapshotInput {
            id: self.id.clone(),
            session_id: self.session_id.clone(),
            created_at: self.created_at.to_rfc3339(),
        }
    }
}

impl App {
    /// `POST /v1/sessions/{id}/snapshots`: a kept image of the session, which goes on.
    pub async fn create_snapshot(
        self: &std::sync::Arc<Self>,
        caller: &ApiKey,
        session_id: &str,
    ) -> Result<SnapshotRow, AppError> {
        // Refused before a paused session of another replica is taken over here: a takeover
        // that never reaches its claim would leave a stale registration behind.
        let row = self.get_session(caller, session_id).await?;
        let dir = self.snapshot_dir(&row.tenant)?;
        self.within_quota(&row.tenant, 0).await?;
        if let Some(held) = self.session_relayed_or_taken(caller, session_id).await? {
            // Its sandbox runs on another replica (or its image is only readable there).
            let answer = self
                .relay_session_step(caller, &held, TurnKind::Snapshot)
                .await?;
            let kept = answer.snapshot_id.ok_or_else(|| {
                AppError::Internal(format!(
                    "replica {} answered a snapshot without its id",
                    held.instance
                ))
            })?;
            return self.get_snapshot(caller, &kept).await;
        }
        // A paused session is restored first: its image is consumed by its resume.
        self.resume_paused(&row).await?;
        let open = self
            .sessions
            .get(session_id)
            .ok_or_else(|| AppError::Conflict(format!("session {session_id} is not open")))?;
        let Ok(mut guard) = open.held.try_lock() else {
            return Err(AppError::Conflict(format!(
                "session {session_id} is running an execution: snapshot it once that ended"
            )));
        };
        if open.runs_processes() {
            return Err(AppError::Conflict(format!(
                "session {session_id} is running a process: snapshot it once its processes ended"
            )));
        }
        let Some(held) = guard.as_mut() else {
            return Err(AppError::Conflict(format!(
                "session {session_id} is not open"
            )));
        };
        let mounts = held.runnable.mounts.clone();
        let inspection = held
            .egress
            .as_ref()
            .and_then(crate::egress::ExecutionEgress::inspection);
        // As a pause (`pause_held`): the sandbox goes on from the image with the session's
        // runner only, so its code contexts end here and answer "ended" until restarted.
        open.contexts.end_all("the sandbox was snapshotted").await;
        let snapshot_id = crate::ids::new("sn");
        let image = dir.join(&snapshot_id);
        let digest = checkpoint_complete(held, &image, &self.instance)
            .await
            .map_err(|err| {
                checkpoint_failed(&format!("the snapshot of session {session_id}"), &err)
            })?;
        let taken = Taken {
            id: &snapshot_id,
            image: &image,
            digest,
            mounts,
            inspected: inspection.is_some(),
        };
        let stored = self.store_image(caller, &row, taken).await;
        if stored.is_ok() {
            self.sessions.paused.carry(&snapshot_id, inspection);
        }
        // The checkpoint stopped the sandbox: the session goes on from the image.
        let Some(held) = guard.take() else {
            return Err(AppError::Internal("the session vanished".into()));
        };
        match self.continue_from(&row, held, &image).await {
            Ok(held) => *guard = Some(held),
            Err(err) => {
                tracing::error!(session_id, error = %err, "the session could not go on after its snapshot");
                drop(guard);
                self.close_session(session_id, ClosedReason::Crashed).await;
            }
        }
        stored
    }

    /// Checks the quota, stores the row and records `snapshot.created`; removes the image
    /// when any of it fails.
    async fn store_image(
        &self,
        caller: &ApiKey,
        row: &SessionRow,
        taken: Taken<'_>,
    ) -> Result<SnapshotRow, AppError> {
        let Taken {
            id: snapshot_id,
            image,
            digest: (sha256, bytes),
            mounts,
            inspected,
        } = taken;
        let stored = async {
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.within_quota(&row.tenant, bytes).await?;
            let now = crate::ids::now_micros();
            let ttl = i64::try_from(self.config.snapshots.ttl_s).unwrap_or(i64::MAX);
            let snapshot = SnapshotRow {
                id: snapshot_id.to_owned(),
                tenant: row.tenant.clone(),
                key_id: caller.id.clone(),
                session_id: row.id.clone(),
                language: row.language.clone(),
                mounts: Json(json!(mounts)),
                path: image.to_string_lossy().into_owned(),
                bytes,
                sha256,
                created_at: now,
                expires_at: now + ChronoDuration::seconds(ttl),
                deleted_at: None,
                inspected,
            };
            self.audit.insert_snapshot(&snapshot).await?;
            self.record_snapshot_event(&snapshot, api_types::EventKind::SnapshotCreated, None)
                .await?;
            Ok::<_, AppError>(snapshot)
        };
        let stored = stored.await;
        if stored.is_err() {
            remove_image(image);
        }
        stored
    }

    /// 429 when `adding` more bytes would take the tenant past `max_bytes_per_tenant`.
    async fn within_quota(&self, tenant: &str, adding: i64) -> Result<(), AppError> {
        let max = i64::try_from(self.config.snapshots.max_bytes_per_tenant).unwrap_or(i64::MAX);
        let used = self.audit.snapshot_bytes(tenant).await?;
        if used.saturating_add(adding) > max || (adding == 0 && used >= max) {
            return Err(AppError::RateLimited(format!(
                "snapshot quota: tenant {tenant} keeps {used} bytes of snapshots and \
                 snapshots.max_bytes_per_tenant is {max}; delete one first"
            )));
        }
        Ok(())
    }

    /// The session's own sandbox again, restored from the image it just wrote, in its places.
    async fn continue_from(
        &self,
        row: &SessionRow,
        held: Held,
        image: &Path,
    ) -> Result<Held, AppError> {
        let Held {
            sandbox,
            home,
            egress,
            runnable,
            language,
            executions,
            _slot,
            _live,
            _share,
            start: _,
        } = held;
        sandbox.discard().await;
        let carried = egress
            .as_ref()
            .and_then(crate::egress::ExecutionEgress::inspection);
        if let Some(egress) = egress {
            egress.finish().await;
        }
        home.remove();
        self.session_cursors.close(&row.id);
        let restore = Restore {
            id: &row.id,
            tenant: &row.tenant,
            image,
            runnable,
            language: &language,
            executions,
            carried,
        };
        self.restore_sandbox(restore, (_slot, _live, _share)).await
    }
}

impl App {
    /// A kept snapshot, for a key that may see it: its tenant's, or any for the roles that see
    /// across tenants; another tenant's is 404 (and audited as a probe).
    pub async fn get_snapshot(&self, caller: &ApiKey, id: &str) -> Result<SnapshotRow, AppError> {
        match self.audit.get_snapshot(id).await? {
            Some(row) if caller.is_any(&Role::ACROSS_TENANTS) || row.tenant == caller.tenant => {
                Ok(row)
            }
            Some(row) => Err(self.cross_tenant_probe(caller, &row.id, &row.tenant).await),
            None => Err(AppError::NotFound),
        }
    }

    pub async fn list_snapshots(&self, caller: &ApiKey) -> Result<Vec<SnapshotRow>, AppError> {
        let tenant = (!caller.is_any(&Role::ACROSS_TENANTS)).then_some(caller.tenant.as_str());
        Ok(self.audit.list_snapshots(tenant).await?)
    }

    /// `DELETE /v1/snapshots/{id}`: the image is removed, the row kept as deleted.
    pub async fn delete_snapshot(
        &self,
        caller: &ApiKey,
        id: &str,
    ) -> Result<SnapshotRow, AppError> {
        self.get_snapshot(caller, id).await?;
        self.drop_snapshot(id, "deleted")
            .await?
            .ok_or(AppError::NotFound)
    }

    /// Removes the snapshots past their `ttl_s` (the reaper's retention sweep).
    pub async fn expire_snapshots(&self) -> usize {
        let expired = match self.audit.expired_snapshots().await {
            Ok(expired) => expired,
            Err(err) => {
                tracing::warn!(error = %err, "cannot list expired snapshots");
                return 0;
            }
        };
        let mut removed = 0;
        for id in expired {
            match self.drop_snapshot(&id, "expired").await {
                Ok(Some(_)) => removed += 1,
                Ok(None) => {}
                Err(err) => tracing::warn!(snapshot_id = %id, error = %err, "snapshot not expired"),
            }
        }
        removed
    }

    async fn drop_snapshot(&self, id: &str, why: &str) -> Result<Option<SnapshotRow>, AppError> {
        let Some(row) = self.audit.delete_snapshot(id).await? else {
            return Ok(None);
        };
        remove_image(&PathBuf::from(&row.path));
        self.sessions.paused.uncarry(&row.id);
        self.record_snapshot_event(&row, api_types::EventKind::SnapshotDeleted, Some(why))
            .await?;
        Ok(Some(row))
    }

    async fn record_snapshot_event(
        &self,
        row: &SnapshotRow,
        kind: api_types::EventKind,
        why: Option<&str>,
    ) -> Result<(), AppError> {
        let event = NewEvent {
            kind,
            execution_id: None,
            key_id: Some(row.key_id.clone()),
            tenant: Some(row.tenant.clone()),
            decision_id: None,
            allow: None,
            reasons: events::no_reasons(),
            input: events::column(&SnapshotOf {
                session_id: row.session_id.clone(),
                snapshot_id: row.id.clone(),
            }),
            decision: events::column(&Snapshot {
                bytes: row.bytes,
                sha256: row.sha256.clone(),
                created_at: row.created_at,
                expires_at: row.expires_at,
                reason: why.map(str::to_owned),
            }),
            policy_revision: None,
        };
        self.audit.record_event(&event).await?;
        Ok(())
    }

    /// The snapshot a `POST /v1/sessions` forks from, looked up for the caller before the
    /// policy decides (`request.from_snapshot`); `None` without `from_snapshot`.
    pub(super) async fn fork_source(
        &self,
        caller: &ApiKey,
        request: &SessionRequest,
    ) -> Result<Option<SnapshotRow>, AppError> {
        let Some(id) = &request.from_snapshot else {
            return Ok(None);
        };
        let snapshot = self.get_snapshot(caller, id).await?;
        if snapshot.language != request.language {
            return Err(AppError::Invalid(format!(
                "snapshot {id} is of a {} session, not {}",
                snapshot.language, request.language
            )));
        }
        Ok(Some(snapshot))
    }

    /// The new session's sandbox, restored from the snapshot under the NEW decision's grant.
    pub(super) async fn start_fork(
        &self,
        who: Whose<'_>,
        snapshot: &SnapshotRow,
        runnable: Runnable,
        places: Places,
    ) -> Result<Held, AppError> {
        let taken_with: Vec<crate::runtime::ReadOnlyMount> =
            serde_json::from_value(snapshot.mounts.0.clone()).unwrap_or_default();
        if taken_with != runnable.mounts {
            return Err(AppError::Conflict(format!(
                "snapshot {} was taken with other mounts than this decision grants: a restore \
                 needs the same ones",
                snapshot.id
            )));
        }
        let carried = self.sessions.paused.carried_by(&snapshot.id);
        if snapshot.inspected && carried.is_none() {
            return Err(AppError::Conflict(format!(
                "snapshot {} is of a session whose grant inspected a destination: its program \
                 trusts a CA whose key only the gateway process that took it held, and that \
                 process has ended (docs/snapshots.md)",
                snapshot.id
            )));
        }
        let image = PathBuf::from(&snapshot.path);
        self.check_image_of(who, &image, &snapshot.sha256).await?;
        let restore = Restore {
            id: who.id,
            tenant: who.tenant,
            image: &image,
            runnable,
            language: &snapshot.language,
            executions: 0,
            carried,
        };
        self.restore_sandbox(restore, places).await
    }
}
