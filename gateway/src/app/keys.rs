//! API keys created over the API (`POST /v1/keys`) or the command line: what a new key may be.

use super::{App, AppError};
use crate::audit::{ApiKey, NewKey, ROLES};

/// Longest tenant name.
const MAX_TENANT_BYTES: usize = 64;

/// Checks a new key's role and tenant: a known role, and a tenant name of 1 to 64 characters
/// from `a-z A-Z 0-9 . _ -` (it is matched against `policies/data`, and shown in logs).
pub fn check_new_key(role: &str, tenant: &str) -> Result<(), String> {
    if !ROLES.contains(&role) {
        return Err(format!("role must be one of {}", ROLES.join(", ")));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES || !tenant.chars().all(valid) {
        return Err(format!(
            "tenant must be 1 to {MAX_TENANT_BYTES} characters from a-z, A-Z, 0-9, '.', '_', '-'"
        ));
    }
    Ok(())
}

impl App {
    /// A new key made by `creator`; the key row and its `key.create` event commit together.
    pub async fn create_key(
        &self,
        creator: &ApiKey,
        role: &str,
        tenant: &str,
    ) -> Result<NewKey, AppError> {
        check_new_key(role, tenant).map_err(AppError::Invalid)?;
        Ok(self
            .audit
            .create_key_by(role, tenant, Some(creator))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_tenant_names_are_checked() {
        assert!(check_new_key("agent", "acme").is_ok());
        assert!(check_new_key("admin", "ops-team_2.eu").is_ok());
        assert!(check_new_key("root", "acme").is_err());
        assert!(check_new_key("agent", "").is_err());
        assert!(check_new_key("agent", "a b").is_err());
        assert!(check_new_key("agent", "acme\n").is_err());
        assert!(check_new_key("agent", &"a".repeat(65)).is_err());
    }
}
