//! What an agent asks for: the body of `POST /v1/executions` (DESIGN 4.2). Shared by the
//! checks (`validate.rs`), the use case (`executions.rs`) and review (`approvals.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use policy_engine::{HostPort, RequestedLimits};

/// Largest accepted program text.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRequest {
    pub language: String,
    pub code: String,
    #[serde(default)]
    pub files: Vec<FileUpload>,
    #[serde(default)]
    pub network: Vec<HostPort>,
    #[serde(default)]
    pub mounts: Vec<String>,
    #[serde(default)]
    pub limits: RequestedLimits,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default = "default_wait")]
    pub wait: bool,
}

fn default_wait() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileUpload {
    pub path: String,
    pub content_b64: String,
}
