//! `key.create`, `key.revoke`, `key.rotate`: an API key changed, by an admin key over the API
//! or by the command line (`via`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::role::Role;

/// Who changed a key: `api` (an admin key, the event's `key_id`) or `command_line`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    Api,
    CommandLine,
}

/// `key.create`'s input: the key asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyCreate {
    pub role: Role,
    pub tenant: String,
    pub principal: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub via: Via,
}

/// `key.create`'s decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyCreated {
    pub created_key_id: String,
}

/// `key.revoke`'s input: the key revoked, as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRevoke {
    pub key_id: String,
    pub role: Role,
    pub tenant: String,
    pub via: Via,
}

/// `key.revoke`'s decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRevoked {
    pub revoked_key_id: String,
}

/// `key.rotate`'s input: the key replaced, and the new key's expiry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRotate {
    pub key_id: String,
    pub role: Role,
    pub tenant: String,
    pub principal: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub via: Via,
}

/// `key.rotate`'s decision: the old key revoked, the new one created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRotated {
    pub revoked_key_id: String,
    pub created_key_id: String,
}
