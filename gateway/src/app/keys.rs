//! API keys over the API (`POST /v1/keys`, `GET /v1/keys`, `DELETE /v1/keys/{id}`) and the
//! command line: what a new key may be, listing, revoking.

use chrono::{DateTime, Utc};

use super::{App, AppError};
use crate::audit::keys::{KeyRow, KeySpec, Revoked};
use crate::audit::{ApiKey, NewKey};
use crate::role::Role;

/// Longest tenant name.
const MAX_TENANT_BYTES: usize = 64;
/// Furthest a key's expiry may lie ahead: ten years.
const MAX_EXPIRY_DAYS: i64 = 3650;

/// A new key, checked: a known role, a tenant name of 1 to 64 characters from
/// `a-z A-Z 0-9 . _ -` (it is matched against `policies/data`, and shown in logs), a principal
/// (if given) in its normalised form (`crate::principal`), and an expiry (if given) ahead of
/// now and at most ten years away.
#[derive(Debug, Clone)]
pub struct CheckedKey {
    pub role: Role,
    pub tenant: String,
    pub principal: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

impl CheckedKey {
    pub fn spec(&self) -> KeySpec<'_> {
        KeySpec {
            role: self.role,
            tenant: &self.tenant,
            principal: self.principal.as_deref(),
            expires_at: self.expires_at,
        }
    }
}

/// Checks a new key (see [`CheckedKey`]); the error says what to fix.
pub fn check_new_key(
    role: &str,
    tenant: &str,
    principal: Option<&str>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<CheckedKey, String> {
    let Some(role) = Role::parse(role) else {
        return Err(format!("role must be one of {}", Role::names(&Role::ALL)));
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES || !tenant.chars().all(valid) {
        return Err(format!(
            "tenant must be 1 to {MAX_TENANT_BYTES} characters from a-z, A-Z, 0-9, '.', '_', '-'"
        ));
    }
    let principal = principal.map(crate::principal::normalise).transpose()?;
    if let Some(at) = expires_at {
        let now = Utc::now();
        if at <= now || at > now + chrono::Duration::days(MAX_EXPIRY_DAYS) {
            return Err(format!(
                "expires_at must lie ahead, at most {MAX_EXPIRY_DAYS} days from now"
            ));
        }
    }
    Ok(CheckedKey {
        role,
        tenant: tenant.to_owned(),
        principal,
        expires_at,
    })
}

/// A key just created, and whether the active policy bundle knows its tenant (`None`: no
/// bundle is loaded). A key of an unknown tenant works but every request it makes is decided
/// for a tenant the policy data does not name (the shipped policy denies: `tenant.unknown`).
#[derive(Debug)]
pub struct Created {
    pub key: NewKey,
    pub tenant_known: Option<bool>,
}

/// The warning given (API answer, command line) when a key's tenant is not in the policy data.
pub fn unknown_tenant_warning(tenant: &str) -> String {
    format!(
        "tenant {tenant} is not in the policy data (policies/data): the policy decides its \
         requests as an unknown tenant's (the shipped policy denies them, tenant.unknown)"
    )
}

impl App {
    /// A new key made by `creator`; the key row and its `key.create` event commit together.
    pub async fn create_key(
        &self,
        creator: &ApiKey,
        checked: &CheckedKey,
    ) -> Result<Created, AppError> {
        let key = self
            .audit
            .create_key_by(&checked.spec(), Some(creator))
            .await?;
        let tenant_known = self.policy.current().state.knows_tenant(&checked.tenant);
        Ok(Created { key, tenant_known })
    }

    /// One page of keys, newest first (admin).
    pub async fn list_keys(
        &self,
        tenant: Option<&str>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<KeyRow>, AppError> {
        Ok(self.audit.list_keys(tenant, before, limit).await?)
    }

    /// Revokes key `id` (admin): refused from the next request on. Revoking a revoked key is a
    /// conflict; an unknown id is not found.
    pub async fn revoke_key(&self, by: &ApiKey, id: &str) -> Result<KeyRow, AppError> {
        match self.audit.revoke_key(id, Some(by)).await? {
            Revoked::Now(row) => {
                tracing::info!(key_id = %id, by = %by.id, "key revoked");
                Ok(row)
            }
            Revoked::Already(_) => Err(AppError::Conflict(format!("key {id} is already revoked"))),
            Revoked::Unknown => Err(AppError::NotFound),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_tenant_names_principals_and_expiry_are_checked() {
        fn check(role: &str, tenant: &str, principal: Option<&str>) -> Result<CheckedKey, String> {
            check_new_key(role, tenant, principal, None)
        }
        assert!(check("agent", "acme", None).is_ok());
        let named = check("admin", "ops-team_2.eu", Some("Ana Ruiz")).unwrap();
        assert_eq!(named.principal.as_deref(), Some("ana ruiz"));
        assert!(check("root", "acme", None).is_err());
        assert!(check("agent", "", None).is_err());
        assert!(check("agent", "a b", None).is_err());
        assert!(check("agent", "acme\n", None).is_err());
        assert!(check("agent", &"a".repeat(65), None).is_err());
        assert!(check("agent", "acme", Some("")).is_err());
        assert!(check("agent", "acme", Some("  ")).is_err());
        assert!(check("agent", "acme", Some("a\tb")).is_err());
        assert!(check("agent", "acme", Some(&"p".repeat(129))).is_err());
        let past = Utc::now() - chrono::Duration::seconds(1);
        assert!(check_new_key("agent", "acme", None, Some(past)).is_err());
        let far = Utc::now() + chrono::Duration::days(MAX_EXPIRY_DAYS + 1);
        assert!(check_new_key("agent", "acme", None, Some(far)).is_err());
        let soon = Utc::now() + chrono::Duration::hours(1);
        assert!(check_new_key("agent", "acme", None, Some(soon)).is_ok());
    }
}
