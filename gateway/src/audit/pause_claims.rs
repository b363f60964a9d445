//! Who restores a paused session (issue 24 item 7; docs/snapshots.md "Replicas"). A paused
//! session holds no sandbox, and its image lies in `snapshots.dir`, which the replicas of one
//! machine may share: the replica asked to restore it claims it here first, and so does a
//! replica adopting the paused sessions of one whose lease expired. Its `session_pauses` row is
//! the token: the claim deletes it and moves `sessions.instance` in one transaction, under the
//! session's row lock, so exactly one replica restores each pause (a failed restore stores the
//! pause again, `AuditStore::store_pause`).

use super::sessions::SessionRow;
use super::snapshots::PauseRow;
use super::{AuditError, AuditStore};
use crate::session_wire::{ClosedReason, SessionStatus};

const PAUSE_COLUMNS: &str = "session_id, image, sha256, bytes, runnable, language, executions, \
                             inspected, closes_when_idle";

/// `ms` as the `float8` PostgreSQL multiplies `interval '1 millisecond'` by.
fn millis(ms: u64) -> f64 {
    ms as f64
}

/// A paused session claimed for restoring: its checkpoint and the replica that held it.
#[derive(Debug)]
pub struct Claimed {
    pub pause: PauseRow,
    pub from: String,
}

/// What closing a session this replica registered did ([`AuditStore::close_own_session`]).
#[derive(Debug)]
pub enum OwnClose {
    /// Closed now (its pause, if any, forgotten with it).
    Closed(Box<SessionRow>),
    /// It was closed already (or is unknown).
    AlreadyClosed,
    /// Another replica holds it now (it restored or adopted it): not closed, not touched.
    Elsewhere(String),
}

impl AuditStore {
    /// A paused session's stored checkpoint, if it has one (`None` also while a replica
    /// restores it).
    pub async fn get_pause(&self, session_id: &str) -> Result<Option<PauseRow>, AuditError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {PAUSE_COLUMNS} FROM session_pauses WHERE session_id = $1"
        ))
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Takes the paused session for `instance` to restore: its pause is removed and the
    /// session is `instance`'s (its lease renewed), in one transaction; `None` when it is not
    /// paused (any more) or another replica claimed it first.
    pub async fn claim_pause(
        &self,
        session_id: &str,
        instance: &str,
        lease_ms: u64,
    ) -> Result<Option<Claimed>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let from: Option<String> = sqlx::query_scalar(
            "SELECT instance FROM sessions WHERE id = $1 AND status = 'paused' FOR UPDATE",
        )
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(from) = from else {
            return Ok(None);
        };
        let pause: Option<PauseRow> = sqlx::query_as(&format!(
            "DELETE FROM session_pauses WHERE session_id = $1 RETURNING {PAUSE_COLUMNS}"
        ))
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(pause) = pause else {
            return Ok(None);
        };
        sqlx::query(
            "UPDATE sessions SET instance = $2, \
             lease_until = now() + $3 * interval '1 millisecond' WHERE id = $1",
        )
        .bind(session_id)
        .bind(instance)
        .bind(millis(lease_ms))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(Claimed { pause, from }))
    }

    /// Gives a claimed pause back to the replica that held it (this replica cannot restore
    /// it): the row stored again and the session `from`'s, in one transaction.
    pub async fn unclaim_pause(&self, pause: &PauseRow, from: &str) -> Result<(), AuditError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO session_pauses ({PAUSE_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (session_id) DO NOTHING"
        ))
        .bind(&pause.session_id)
        .bind(&pause.image)
        .bind(&pause.sha256)
        .bind(pause.bytes)
        .bind(&pause.runnable)
        .bind(&pause.language)
        .bind(pause.executions)
        .bind(pause.inspected)
        .bind(pause.closes_when_idle)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE sessions SET instance = $2 WHERE id = $1 AND status = 'paused'")
            .bind(&pause.session_id)
            .bind(from)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Closes the session if it is still `instance`'s, its pause forgotten in the same
    /// transaction, under the session's row lock (the lock [`AuditStore::claim_pause`] takes):
    /// a stale registration (a takeover never claimed, a missed `MOVED` notice)
    /// cannot close, or forget the pause of, a session another replica serves now.
    pub async fn close_own_session(
        &self,
        id: &str,
        reason: ClosedReason,
        instance: &str,
    ) -> Result<OwnClose, AuditError> {
        let mut tx = self.pool.begin().await?;
        let owner: Option<(String, SessionStatus)> =
            sqlx::query_as("SELECT instance, status FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        match owner {
            Some((owner, status)) if status != SessionStatus::Closed && owner != instance => {
                return Ok(OwnClose::Elsewhere(owner));
            }
            Some(_) => {}
            None => return Ok(OwnClose::AlreadyClosed),
        }
        sqlx::query("DELETE FROM session_pauses WHERE session_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let closed: Option<SessionRow> = sqlx::query_as(
            "UPDATE sessions SET status = 'closed', closed_reason = $2, closed_at = now() \
             WHERE id = $1 AND status <> 'closed' RETURNING *",
        )
        .bind(id)
        .bind(reason.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(closed.map_or(OwnClose::AlreadyClosed, |row| {
            OwnClose::Closed(Box::new(row))
        }))
    }

    /// Paused sessions of other replicas whose lease expired (their replica died), with their
    /// checkpoints; those `adoptable` says this replica can serve become `by`'s (lease renewed)
    /// instead of being closed by [`AuditStore::close_expired`]. Rows another replica is
    /// adopting at the same moment are skipped (`SKIP LOCKED`).
    pub async fn adopt_expired_pauses(
        &self,
        by: &str,
        lease_ms: u64,
        adoptable: impl Fn(&PauseRow) -> bool,
    ) -> Result<Vec<(SessionRow, PauseRow)>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let sessions: Vec<SessionRow> = sqlx::query_as(
            "SELECT s.* FROM sessions s WHERE s.status = 'paused' AND s.instance <> $1 \
             AND s.instance <> '' \
             AND COALESCE(s.lease_until, s.created_at + $2 * interval '1 millisecond') < now() \
             AND EXISTS (SELECT 1 FROM session_pauses p WHERE p.session_id = s.id) \
             ORDER BY s.id LIMIT 64 FOR UPDATE OF s SKIP LOCKED",
        )
        .bind(by)
        .bind(millis(lease_ms))
        .fetch_all(&mut *tx)
        .await?;
        let ids: Vec<String> = sessions.iter().map(|row| row.id.clone()).collect();
        // Locked too: a pause forgotten meanwhile (`forget_pause` takes no session lock) waits
        // for this transaction, or is not read; each pause goes with its own session below.
        let pauses: Vec<PauseRow> = sqlx::query_as(&format!(
            "SELECT {PAUSE_COLUMNS} FROM session_pauses WHERE session_id = ANY($1) \
             ORDER BY session_id FOR UPDATE"
        ))
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
        let adopted: Vec<(SessionRow, PauseRow)> = pair_by_session(sessions, pauses)
            .into_iter()
            .filter(|(_, pause)| adoptable(pause))
            .collect();
        let ids: Vec<&str> = adopted.iter().map(|(row, _)| row.id.as_str()).collect();
        sqlx::query(
            "UPDATE sessions SET instance = $1, \
             lease_until = now() + $2 * interval '1 millisecond' WHERE id = ANY($3)",
        )
        .bind(by)
        .bind(millis(lease_ms))
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(adopted)
    }
}

/// Each session with its own pause (by id, never by position: a pause forgotten between the
/// two reads would otherwise hand a session another session's image); a session whose pause is
/// gone is left out.
pub(super) fn pair_by_session(
    sessions: Vec<SessionRow>,
    pauses: Vec<PauseRow>,
) -> Vec<(SessionRow, PauseRow)> {
    let mut pauses: std::collections::HashMap<String, PauseRow> = pauses
        .into_iter()
        .map(|pause| (pause.session_id.clone(), pause))
        .collect();
    sessions
        .into_iter()
        .filter_map(|row| pauses.remove(&row.id).map(|pause| (row, pause)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sqlx::types::Json;

    use super::*;
    use crate::session_wire::SessionStatus;

    fn session(id: &str) -> SessionRow {
        let now = chrono::Utc::now();
        SessionRow {
            id: id.to_owned(),
            tenant: format!("tenant-of-{id}"),
            key_id: "k".into(),
            language: "python".into(),
            status: SessionStatus::Paused,
            closed_reason: None,
            decision: Json(json!({})),
            limits: Json(json!({})),
            idle_timeout_s: 60,
            ttl_s: 600,
            executions: 0,
            instance: "dead".into(),
            container: None,
            created_at: now,
            last_used_at: now,
            expires_at: now,
            closed_at: None,
            approval_id: None,
            start: None,
        }
    }

    fn pause(id: &str) -> PauseRow {
        PauseRow {
            session_id: id.to_owned(),
            image: format!("/snapshots/{id}-ck"),
            sha256: format!("sha-of-{id}"),
            bytes: 1,
            runnable: Json(json!({})),
            language: "python".into(),
            executions: 0,
            inspected: false,
            closes_when_idle: false,
        }
    }

    /// The pause of the middle session was forgotten between the two reads: the sessions
    /// after it must not take their neighbour's image (they did when paired by position).
    #[test]
    fn a_session_is_paired_with_its_own_pause_only() {
        let sessions = vec![session("s1"), session("s2"), session("s3")];
        let pauses = vec![pause("s1"), pause("s3")];
        let paired = pair_by_session(sessions, pauses);
        let ids: Vec<(&str, &str, &str)> = paired
            .iter()
            .map(|(row, pause)| {
                (
                    row.id.as_str(),
                    pause.session_id.as_str(),
                    pause.sha256.as_str(),
                )
            })
            .collect();
        assert_eq!(
            ids,
            vec![("s1", "s1", "sha-of-s1"), ("s3", "s3", "sha-of-s3")]
        );
    }
}
