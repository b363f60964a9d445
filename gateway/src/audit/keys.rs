//! The `api_keys` table: keys are created (only the SHA-256 of the secret is stored), looked up
//! by hash on every request, listed, revoked and rotated. Every change commits together with its
//! audit event (`key.create`, `key.revoke`, `key.rotate`).
//!
//! A key is live while `revoked_at` is unset and `expires_at` (if any) lies ahead. The lookup
//! asks the database on every request, so a revocation or an expiry holds for the next request
//! on every replica; nothing caches a key.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use sqlx::{Postgres, Transaction};

use super::events::keys::{
    KeyCreate, KeyCreated, KeyRevoke, KeyRevoked, KeyRotate, KeyRotated, Via,
};
use super::key_withdrawals::{withdraw_pending_of, Withdrawn};
use super::{chain, events, key_hash, AuditError, AuditStore, NewEvent};
use crate::role::Role;

/// `last_used_at` is written at most this often per key (seconds), so authentication does not
/// turn every request into a write.
const LAST_USED_GRANULARITY_S: i64 = 60;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApiKey {
    pub id: String,
    pub role: Role,
    pub tenant: String,
    /// The person or system behind the key (default: the key id), normalised
    /// (`crate::principal`). A reviewer key of the requesting principal cannot approve that
    /// principal's requests.
    pub principal: String,
}

impl ApiKey {
    /// Whether the key holds one of `roles`.
    pub fn is_any(&self, roles: &[Role]) -> bool {
        roles.contains(&self.role)
    }
}

/// A freshly created key: `secret` is shown once and never stored.
#[derive(Debug)]
pub struct NewKey {
    pub id: String,
    pub secret: String,
    /// The principal as stored (normalised; the key id when none was given).
    pub principal: String,
}

/// What a new key is: its role, tenant, principal (`None`: the key's own id; otherwise already
/// checked by `crate::principal::normalise`) and optional expiry.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec<'a> {
    pub role: Role,
    pub tenant: &'a str,
    pub principal: Option<&'a str>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// One key as the listing shows it: never its hash.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct KeyRow {
    pub id: String,
    pub role: Role,
    pub tenant: String,
    pub principal: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// When the key last authenticated a request (to the minute).
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Whether a key still works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    Active,
    Revoked,
    Expired,
}

impl KeyState {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Revoked => "revoked",
            KeyState::Expired => "expired",
        }
    }
}

impl std::fmt::Display for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl KeyRow {
    /// Revoked, expired (at `now`) or active.
    pub fn state(&self, now: DateTime<Utc>) -> KeyState {
        if self.revoked_at.is_some() {
            KeyState::Revoked
        } else if self.expires_at.is_some_and(|at| at <= now) {
            KeyState::Expired
        } else {
            KeyState::Active
        }
    }
}

/// What revoking found.
#[derive(Debug)]
pub enum Revoked {
    /// Revoked now (the row as it now is).
    Now(KeyRow),
    /// It was revoked before; nothing changed.
    Already(KeyRow),
    Unknown,
}

const KEY_COLUMNS: &str = "id, role, tenant, COALESCE(principal, id) AS principal, created_at, \
     expires_at, revoked_at, last_used_at";

impl AuditStore {
    /// Creates a key on the operator's behalf (`sandgate keys create`): see [`Self::create_key_by`].
    pub async fn create_key(&self, role: &str, tenant: &str) -> Result<NewKey, AuditError> {
        self.create_key_for(role, tenant, None).await
    }

    /// Creates a key for `principal` (default: the new key's own id) on the operator's behalf.
    /// A principal that does not normalise is stored as given (callers check it first).
    pub async fn create_key_for(
        &self,
        role: &str,
        tenant: &str,
        principal: Option<&str>,
    ) -> Result<NewKey, AuditError> {
        let spec = KeySpec {
            role: Role::parse(role).ok_or_else(|| AuditError::UnknownRole(role.to_owned()))?,
            tenant,
            principal,
            expires_at: None,
        };
        self.create_key_by(&spec, None).await
    }

    /// Creates a key; only the SHA-256 of the returned secret is stored. The `key.create` audit
    /// event (naming `creator`, the admin key that asked, or none for the command line) commits
    /// with it.
    pub async fn create_key_by(
        &self,
        spec: &KeySpec<'_>,
        creator: Option<&ApiKey>,
    ) -> Result<NewKey, AuditError> {
        let mut tx = self.pool.begin().await?;
        let key = insert_key(&mut tx, spec).await?;
        let event = key_event(
            api_types::EventKind::KeyCreate,
            creator,
            &KeyCreate {
                role: spec.role,
                tenant: spec.tenant.to_owned(),
                principal: key.principal.clone(),
                expires_at: spec.expires_at,
                via: via(creator),
            },
            &KeyCreated {
                created_key_id: key.id.clone(),
            },
        );
        chain::append(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(key)
    }

    /// The live key (not revoked, not expired) whose secret this is, if any. Marks it used
    /// (at most once a minute).
    pub async fn find_key(&self, secret: &str) -> Result<Option<ApiKey>, AuditError> {
        let found: Option<(String, Role, String, String, bool)> = sqlx::query_as(
            "SELECT id, role, tenant, COALESCE(principal, id), \
             last_used_at IS NULL OR last_used_at < now() - make_interval(secs => $2) \
             FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL \
             AND (expires_at IS NULL OR expires_at > now())",
        )
        .bind(key_hash(secret))
        .bind(LAST_USED_GRANULARITY_S as f64)
        .fetch_optional(&self.pool)
        .await?;
        let Some((id, role, tenant, principal, stale)) = found else {
            return Ok(None);
        };
        if stale {
            sqlx::query("UPDATE api_keys SET last_used_at = now() WHERE id = $1")
                .bind(&id)
                .execute(&self.pool)
                .await?;
        }
        Ok(Some(ApiKey {
            id,
            role,
            tenant,
            principal,
        }))
    }

    /// The principal of key `id`, revoked or not; `None` for an unknown id.
    pub async fn key_principal(&self, id: &str) -> Result<Option<String>, AuditError> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(principal, id) FROM api_keys WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Keys, newest first, `limit` at a time; `before` is the previous page's last key id.
    pub async fn list_keys(
        &self,
        tenant: Option<&str>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<KeyRow>, AuditError> {
        let rows = sqlx::query_as(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE ($1::text IS NULL OR tenant = $1) \
             AND ($2::text IS NULL OR (created_at, id) < \
                  (SELECT created_at, id FROM api_keys WHERE id = $2)) \
             ORDER BY created_at DESC, id DESC LIMIT $3"
        ))
        .bind(tenant)
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Revokes key `id` (by `by`, or the command line), with its `key.revoke` event.
    pub async fn revoke_key(&self, id: &str, by: Option<&ApiKey>) -> Result<Revoked, AuditError> {
        let mut tx = self.pool.begin().await?;
        let Some(row) = lock_key(&mut tx, id).await? else {
            return Ok(Revoked::Unknown);
        };
        if row.revoked_at.is_some() {
            return Ok(Revoked::Already(row));
        }
        revoke_in(&mut tx, id).await?;
        let event = key_event(
            api_types::EventKind::KeyRevoke,
            by,
            &KeyRevoke {
                key_id: id.to_owned(),
                role: row.role,
                tenant: row.tenant.clone(),
                via: via(by),
            },
            &KeyRevoked {
                revoked_key_id: id.to_owned(),
            },
        );
        chain::append(&mut tx, &event).await?;
        let withdrawn = withdraw_pending_of(&mut tx, id, by).await?;
        let row = lock_key(&mut tx, id)
            .await?
            .ok_or(AuditError::Unavailable(sqlx::Error::RowNotFound))?;
        tx.commit().await?;
        self.count_withdrawn(&withdrawn);
        Ok(Revoked::Now(row))
    }

    /// Replaces live key `id` by a new key of the same role, tenant and principal (expiring at
    /// `expires_at`, if given) and revokes the old one, with one `key.rotate` event. `None`: no
    /// live key has that id.
    pub async fn rotate_key(
        &self,
        id: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<Option<NewKey>, AuditError> {
        let mut tx = self.pool.begin().await?;
        let Some(old) = lock_key(&mut tx, id).await? else {
            return Ok(None);
        };
        if old.state(Utc::now()) != KeyState::Active {
            return Ok(None);
        }
        let spec = KeySpec {
            role: old.role,
            tenant: &old.tenant,
            principal: Some(&old.principal),
            expires_at,
        };
        let key = insert_key(&mut tx, &spec).await?;
        revoke_in(&mut tx, id).await?;
        let event = key_event(
            api_types::EventKind::KeyRotate,
            None,
            &KeyRotate {
                key_id: id.to_owned(),
                role: old.role,
                tenant: old.tenant.clone(),
                principal: old.principal.clone(),
                expires_at,
                via: via(None),
            },
            &KeyRotated {
                revoked_key_id: id.to_owned(),
                created_key_id: key.id.clone(),
            },
        );
        chain::append(&mut tx, &event).await?;
        let withdrawn = withdraw_pending_of(&mut tx, id, None).await?;
        tx.commit().await?;
        self.count_withdrawn(&withdrawn);
        Ok(Some(key))
    }

    /// Executions withdrawn with a revoked key ended `cancelled` (sessions were never counted).
    fn count_withdrawn(&self, withdrawn: &[Withdrawn]) {
        for _ in withdrawn.iter().filter(|w| w.execution_id.is_some()) {
            self.metrics
                .execution_finished(crate::status::ExecutionStatus::Cancelled);
        }
    }
}

async fn insert_key(
    tx: &mut Transaction<'_, Postgres>,
    spec: &KeySpec<'_>,
) -> Result<NewKey, AuditError> {
    let mut id_bytes = [0u8; 8];
    let mut secret_bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut id_bytes);
    rand::rngs::OsRng.fill_bytes(&mut secret_bytes);
    let id = format!("key_{}", hex::encode(id_bytes));
    let secret = format!(
        "sgk_{}_{}",
        hex::encode(id_bytes),
        hex::encode(secret_bytes)
    );
    // Stored in canonical form whoever calls (callers refuse what does not normalise).
    let principal = match spec.principal {
        Some(raw) => crate::principal::normalise(raw).unwrap_or_else(|_| raw.to_owned()),
        None => id.clone(),
    };
    sqlx::query(
        "INSERT INTO api_keys (id, key_hash, role, tenant, principal, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&id)
    .bind(key_hash(&secret))
    .bind(spec.role)
    .bind(spec.tenant)
    .bind(&principal)
    .bind(spec.expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(NewKey {
        id,
        secret,
        principal,
    })
}

async fn lock_key(
    tx: &mut Transaction<'_, Postgres>,
    id: &str,
) -> Result<Option<KeyRow>, AuditError> {
    let row = sqlx::query_as(&format!(
        "SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row)
}

async fn revoke_in(tx: &mut Transaction<'_, Postgres>, id: &str) -> Result<(), AuditError> {
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn via(by: Option<&ApiKey>) -> Via {
    if by.is_some() {
        Via::Api
    } else {
        Via::CommandLine
    }
}

fn key_event(
    kind: api_types::EventKind,
    by: Option<&ApiKey>,
    input: &impl Serialize,
    decision: &impl Serialize,
) -> NewEvent {
    NewEvent {
        kind,
        execution_id: None,
        key_id: by.map(|key| key.id.clone()),
        tenant: by.map(|key| key.tenant.clone()),
        decision_id: None,
        allow: Some(true),
        reasons: events::no_reasons(),
        input: events::column(input),
        decision: events::column(decision),
        policy_revision: None,
    }
}
