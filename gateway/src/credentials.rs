//! The values of the credentials the egress proxy attaches to inspected requests: read from the
//! gateway's environment or from files when the gateway starts, and again on every reload
//! (SIGHUP, `POST /v1/policy/reload`), so a rotated token file takes effect without a restart.
//!
//! Errors name the credential and where its value should come from, never the value. A reload
//! that cannot read every value changes nothing: the previous values stay, and the error says
//! which credential failed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use egress_proxy::{Credential, EgressProxy, Secret};

use crate::config::CredentialConfig;

/// Longest credential value read from a file or variable.
const MAX_CREDENTIAL_BYTES: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("credential {name}: environment variable {var} is not set (or not UTF-8)")]
    Env { name: String, var: String },
    #[error("credential {name}: cannot read {path}")]
    File {
        name: String,
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "credential {name}: the value is empty, longer than 16 KiB or holds a control character"
    )]
    Value { name: String },
}

/// Every configured credential with its value read now.
pub fn load(
    configured: &BTreeMap<String, CredentialConfig>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, Credential>, CredentialError> {
    let mut credentials = BTreeMap::new();
    for (name, config) in configured {
        let value = value_of(name, config, &env)?;
        credentials.insert(
            name.clone(),
            Credential {
                name: name.clone(),
                header: config.header.clone(),
                format: config.format.clone(),
                value,
            },
        );
    }
    Ok(credentials)
}

/// Reads every value again and, only if all could be read, gives them to the proxy: executions
/// started from now on use them. Returns how many credentials there are.
pub fn reload(
    proxy: &EgressProxy,
    configured: &BTreeMap<String, CredentialConfig>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<usize, CredentialError> {
    let credentials = load(configured, env)?;
    let count = credentials.len();
    proxy.config().credentials.replace(credentials);
    Ok(count)
}

fn value_of(
    name: &str,
    config: &CredentialConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Secret, CredentialError> {
    let raw = match (&config.value_env, &config.value_file) {
        (Some(var), _) => env(var).ok_or_else(|| CredentialError::Env {
            name: name.to_owned(),
            var: var.clone(),
        })?,
        (None, Some(path)) => {
            std::fs::read_to_string(path).map_err(|err| CredentialError::File {
                name: name.to_owned(),
                path: path.clone(),
                err,
            })?
        }
        (None, None) => String::new(),
    };
    let value = raw.strip_suffix('\n').unwrap_or(&raw);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.is_empty() || value.len() > MAX_CREDENTIAL_BYTES || value.chars().any(char::is_control)
    {
        return Err(CredentialError::Value {
            name: name.to_owned(),
        });
    }
    Ok(Secret::new(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &str = "sgsecret-unit-test-value";

    fn configured(
        value_env: Option<&str>,
        value_file: Option<PathBuf>,
    ) -> BTreeMap<String, CredentialConfig> {
        BTreeMap::from([(
            "github".to_owned(),
            CredentialConfig {
                value_env: value_env.map(str::to_owned),
                value_file,
                header: "authorization".to_owned(),
                format: "Bearer {value}".to_owned(),
            },
        )])
    }

    fn chain(err: &CredentialError) -> String {
        crate::errors::error_chain(err)
    }

    #[test]
    fn values_come_from_the_environment_or_a_file_without_the_final_newline() {
        let from_env = load(&configured(Some("GH"), None), |var| {
            (var == "GH").then(|| VALUE.to_owned())
        })
        .unwrap();
        assert_eq!(from_env["github"].value.expose(), VALUE);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{VALUE}\r\n")).unwrap();
        let from_file = load(&configured(None, Some(path)), |_| None).unwrap();
        assert_eq!(from_file["github"].value.expose(), VALUE);
        assert!(!format!("{from_file:?}").contains(VALUE), "{from_file:?}");
    }

    #[test]
    fn errors_name_the_credential_and_its_source_never_the_value() {
        let missing = load(&configured(Some("GH"), None), |_| None).unwrap_err();
        assert_eq!(
            chain(&missing),
            "credential github: environment variable GH is not set (or not UTF-8)"
        );
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let unreadable = load(&configured(None, Some(gone.clone())), |_| None).unwrap_err();
        let text = chain(&unreadable);
        assert!(
            text.starts_with(&format!(
                "credential github: cannot read {}: ",
                gone.display()
            )),
            "{text}"
        );
        let bad = format!("{VALUE}\u{7}");
        let invalid = load(&configured(Some("GH"), None), |_| Some(bad.clone())).unwrap_err();
        let text = chain(&invalid);
        assert!(
            text.starts_with("credential github: the value is empty"),
            "{text}"
        );
        for err in [&missing, &unreadable, &invalid] {
            assert!(!chain(err).contains(VALUE) && !format!("{err:?}").contains(VALUE));
        }
    }
}
