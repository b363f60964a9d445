//! Requests relayed to the replica holding a session (`session_turns`): the asking
//! replica inserts one, the owner claims it (`picked_at`), runs it and writes the answer; an
//! asker that gives up before the claim marks it abandoned, so exactly one of the two wins.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use super::keys::ApiKey;
use super::{AuditError, AuditStore};

/// What a relayed request asks of the session's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnKind {
    /// `POST /v1/sessions/{id}/executions`.
    Execute,
    /// `DELETE /v1/sessions/{id}`.
    Close,
    /// `POST /v1/sessions/{id}/pause` of a session whose sandbox runs on the owner.
    Pause,
    /// `POST /v1/sessions/{id}/resume` of a session paused where the asker cannot read its
    /// image (`snapshots.dir` not shared).
    Resume,
    /// `POST /v1/sessions/{id}/snapshots` (the answer names the snapshot kept).
    Snapshot,
}

impl TurnKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TurnKind::Execute => "execute",
            TurnKind::Close => "close",
            TurnKind::Pause => "pause",
            TurnKind::Resume => "resume",
            TurnKind::Snapshot => "snapshot",
        }
    }

    const ALL: [TurnKind; 5] = [
        TurnKind::Execute,
        TurnKind::Close,
        TurnKind::Pause,
        TurnKind::Resume,
        TurnKind::Snapshot,
    ];

    pub fn parse(text: &str) -> Option<TurnKind> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

/// Why the owner refused or failed a relayed request (the closed set of the column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnErrorCode {
    Invalid,
    NotFound,
    Forbidden,
    Conflict,
    RateLimited,
    Unavailable,
    Internal,
}

impl TurnErrorCode {
    const ALL: [TurnErrorCode; 7] = [
        TurnErrorCode::Invalid,
        TurnErrorCode::NotFound,
        TurnErrorCode::Forbidden,
        TurnErrorCode::Conflict,
        TurnErrorCode::RateLimited,
        TurnErrorCode::Unavailable,
        TurnErrorCode::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TurnErrorCode::Invalid => "invalid",
            TurnErrorCode::NotFound => "not_found",
            TurnErrorCode::Forbidden => "forbidden",
            TurnErrorCode::Conflict => "conflict",
            TurnErrorCode::RateLimited => "rate_limited",
            TurnErrorCode::Unavailable => "unavailable",
            TurnErrorCode::Internal => "internal",
        }
    }

    pub fn parse(text: &str) -> Option<TurnErrorCode> {
        Self::ALL.into_iter().find(|code| code.as_str() == text)
    }
}

// Decoded under the one rule of `super::unknown_value` (a value outside the set is not read).
api_types::stored_text!(TurnKind);
api_types::stored_text!(TurnErrorCode);

/// A request to relay.
#[derive(Debug)]
pub struct NewTurn<'a> {
    pub id: &'a str,
    pub session_id: &'a str,
    pub owner: &'a str,
    pub asked_by: &'a str,
    pub key_id: &'a str,
    pub kind: TurnKind,
    pub request: Value,
}

/// One row of `session_turns`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TurnRow {
    pub id: String,
    pub session_id: String,
    pub owner: String,
    pub asked_by: String,
    pub key_id: String,
    pub kind: TurnKind,
    pub request: Json<Value>,
    pub created_at: DateTime<Utc>,
    pub picked_at: Option<DateTime<Utc>>,
    pub abandoned_at: Option<DateTime<Utc>>,
    pub answered_at: Option<DateTime<Utc>>,
    pub execution_id: Option<String>,
    pub error_code: Option<TurnErrorCode>,
    pub error: Option<String>,
    /// The snapshot a relayed `snapshot` kept.
    pub snapshot_id: Option<String>,
}

/// The owner's answer.
#[derive(Debug)]
pub enum TurnAnswer<'a> {
    /// Done; the execution it recorded, if it was one.
    Done(Option<&'a str>),
    /// A relayed snapshot kept this one.
    Kept(&'a str),
    Refused(TurnErrorCode, &'a str),
}

/// How long a relayed request row is kept at most (an asker that died never deletes its own).
const KEEP_S: f64 = 3600.0;

impl AuditStore {
    pub async fn insert_turn(&self, turn: &NewTurn<'_>) -> Result<(), AuditError> {
        sqlx::query(
            "INSERT INTO session_turns (id, session_id, owner, asked_by, key_id, kind, request) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(turn.id)
        .bind(turn.session_id)
        .bind(turn.owner)
        .bind(turn.asked_by)
        .bind(turn.key_id)
        .bind(turn.kind)
        .bind(Json(&turn.request))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_turn(&self, id: &str) -> Result<Option<TurnRow>, AuditError> {
        Ok(sqlx::query_as("SELECT * FROM session_turns WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The owner takes a waiting request (`None`: abandoned, taken, or not this owner's).
    pub async fn claim_turn(&self, id: &str, owner: &str) -> Result<Option<TurnRow>, AuditError> {
        Ok(sqlx::query_as(
            "UPDATE session_turns SET picked_at = now() WHERE id = $1 AND owner = $2 \
             AND picked_at IS NULL AND abandoned_at IS NULL RETURNING *",
        )
        .bind(id)
        .bind(owner)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Requests waiting for `owner` (a lost notification is found here), oldest first.
    pub async fn waiting_turns(&self, owner: &str) -> Result<Vec<String>, AuditError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM session_turns WHERE owner = $1 AND picked_at IS NULL \
             AND abandoned_at IS NULL ORDER BY created_at LIMIT 64",
        )
        .bind(owner)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The asker gives up on a request the owner has not taken; `false`: it was taken.
    pub async fn abandon_turn(&self, id: &str) -> Result<bool, AuditError> {
        let done = sqlx::query(
            "UPDATE session_turns SET abandoned_at = now() WHERE id = $1 AND picked_at IS NULL",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn answer_turn(&self, id: &str, answer: TurnAnswer<'_>) -> Result<(), AuditError> {
        let (execution, snapshot, code, error) = match answer {
            TurnAnswer::Done(execution) => (execution, None, None, None),
            TurnAnswer::Kept(snapshot) => (None, Some(snapshot), None, None),
            TurnAnswer::Refused(code, message) => (None, None, Some(code), Some(message)),
        };
        sqlx::query(
            "UPDATE session_turns SET answered_at = now(), execution_id = $2, error_code = $3, \
             error = $4, snapshot_id = $5 WHERE id = $1",
        )
        .bind(id)
        .bind(execution)
        .bind(code)
        .bind(error)
        .bind(snapshot)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The asker has read the answer (or gave up): the row goes; old rows go with it.
    pub async fn delete_turn(&self, id: &str) -> Result<(), AuditError> {
        sqlx::query(
            "DELETE FROM session_turns WHERE id = $1 \
             OR created_at < now() - $2 * interval '1 second'",
        )
        .bind(id)
        .bind(KEEP_S)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The live key (not revoked, not expired) with this id: the owner acts for the caller the
    /// asking replica authenticated, as long as that key still holds.
    pub async fn live_key_by_id(&self, id: &str) -> Result<Option<ApiKey>, AuditError> {
        let found: Option<(String, crate::role::Role, String, String)> = sqlx::query_as(
            "SELECT id, role, tenant, COALESCE(principal, id) FROM api_keys WHERE id = $1 \
             AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.map(|(id, role, tenant, principal)| ApiKey {
            id,
            role,
            tenant,
            principal,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_codes_read_back_as_written() {
        for kind in TurnKind::ALL {
            assert_eq!(TurnKind::parse(kind.as_str()), Some(kind));
        }
        for code in TurnErrorCode::ALL {
            assert_eq!(TurnErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(TurnErrorCode::parse("teapot"), None);
    }
}
