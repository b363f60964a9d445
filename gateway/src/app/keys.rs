//! API keys created over the API (`POST /v1/keys`) or the command line: what a new key may be.

use super::{App, AppError};
use crate::audit::{ApiKey, NewKey, ROLES};

/// Longest tenant name.
const MAX_TENANT_BYTES: usize = 64;
/// Longest principal name.
const MAX_PRINCIPAL_BYTES: usize = 128;

/// Checks a new key: a known role, a tenant name of 1 to 64 characters from `a-z A-Z 0-9 . _ -`
/// (it is matched against `policies/data`, and shown in logs), and a principal (if given) of 1
/// to 128 bytes without control characters.
pub fn check_new_key(role: &str, tenant: &str, principal: Option<&str>) -> Result<(), String> {
    if !ROLES.contains(&role) {
        return Err(format!("role must be one of {}", ROLES.join(", ")));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES || !tenant.chars().all(valid) {
        return Err(format!(
            "tenant must be 1 to {MAX_TENANT_BYTES} characters from a-z, A-Z, 0-9, '.', '_', '-'"
        ));
    }
    if let Some(principal) = principal {
        if principal.is_empty()
            || principal.len() > MAX_PRINCIPAL_BYTES
            || principal.chars().any(char::is_control)
        {
            return Err(format!(
                "principal must be 1 to {MAX_PRINCIPAL_BYTES} bytes without control characters"
            ));
        }
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
        principal: Option<&str>,
    ) -> Result<NewKey, AppError> {
        check_new_key(role, tenant, principal).map_err(AppError::Invalid)?;
        Ok(self
            .audit
            .create_key_by(role, tenant, principal, Some(creator))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_tenant_names_are_checked() {
        assert!(check_new_key("agent", "acme", None).is_ok());
        assert!(check_new_key("admin", "ops-team_2.eu", Some("Ana Ruiz")).is_ok());
        assert!(check_new_key("root", "acme", None).is_err());
        assert!(check_new_key("agent", "", None).is_err());
        assert!(check_new_key("agent", "a b", None).is_err());
        assert!(check_new_key("agent", "acme\n", None).is_err());
        assert!(check_new_key("agent", &"a".repeat(65), None).is_err());
        assert!(check_new_key("agent", "acme", Some("")).is_err());
        assert!(check_new_key("agent", "acme", Some("a\tb")).is_err());
        assert!(check_new_key("agent", "acme", Some(&"p".repeat(129))).is_err());
    }
}
