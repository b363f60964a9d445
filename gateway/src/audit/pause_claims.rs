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
        let pauses: Vec<PauseRow> = sqlx::query_as(&format!(
            "SELECT {PAUSE_COLUMNS} FROM session_pauses WHERE session_id = ANY($1) \
             ORDER BY session_id"
        ))
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
        let adopted: Vec<(SessionRow, PauseRow)> = sessions
            .into_iter()
            .zip(pauses)
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
