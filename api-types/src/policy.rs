//! The policy's types that appear on the API as they are: a destination asked
//! for, the limits asked for and granted, and a decision's reasons. `policy-engine` re-exports
//! them, so the policy input and the API body are one type.

use serde::{Deserialize, Serialize};

/// One network destination the request asks to reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

/// Limits the client asked for; absent fields are left out of the policy input entirely. An
/// unknown name (`timeout` for `timeout_ms`) is refused, naming the allowed ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequestedLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
}

impl RequestedLimits {
    /// Nothing asked for (left out of a client's body).
    pub fn is_empty(&self) -> bool {
        *self == RequestedLimits::default()
    }
}

/// Why the policy decided as it did; `code` is a bounded, dotted identifier (`tenant.unknown`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Reason {
    pub code: String,
    pub message: String,
}

/// The resource limits the sandbox runs with. All fields are required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Limits {
    pub timeout_ms: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub disk_mb: u64,
    pub output_bytes: u64,
}

/// The answer to `POST /v1/policy/reload` and `POST /v1/policy/rollback` when the bundle was
/// accepted (a rejected one is an error body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyAccepted {
    pub accepted: bool,
    /// The revision now active, and the one before.
    pub revision: String,
    pub previous: String,
    pub changed: bool,
    /// Which credentials were read again (reload only, when the gateway has any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsReload>,
}

/// What reading the credentials' values again gave: how many were read, or the error naming
/// the credential whose value could not be read (the previous values then stay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CredentialsReload {
    Reloaded { reloaded: usize },
    Failed { error: String },
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `credentials` is written as the `json!` objects it was before it was typed, and read back.
    #[test]
    fn credentials_reload_is_written_as_before() {
        for (typed, old) in [
            (
                CredentialsReload::Reloaded { reloaded: 3 },
                json!({"reloaded": 3}),
            ),
            (
                CredentialsReload::Failed {
                    error: "credential github: file missing".to_owned(),
                },
                json!({"error": "credential github: file missing"}),
            ),
        ] {
            assert_eq!(serde_json::to_string(&typed).unwrap(), old.to_string());
            let back: CredentialsReload = serde_json::from_value(old).unwrap();
            assert_eq!(back, typed);
        }
    }
}
