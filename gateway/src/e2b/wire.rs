//! E2B's control-plane JSON, field for field as `spec/openapi.yml` of e2b-dev/E2B names it
//! (and as the Python SDK `e2b` 2.63.0 sends and parses it). Only the fields sandgate reads or
//! answers; unknown request fields are ignored, as E2B's API does, but the ones asking for
//! something sandgate does not do are refused by name (`NewSandbox::unsupported`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The envd version sandgate's `/e2b` speaks for: the SDK picks its code paths by it
/// (>= 0.4.0: no default-user header; >= 0.5.2: `close_stdin` is offered).
pub const ENVD_VERSION: &str = "0.5.7";

/// `POST /sandboxes` and `POST /v2/sandboxes` (`NewSandbox` / `NewSandboxV2`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds the sandbox lives from now (E2B's default: 15 s in the API, 300 s in the SDKs).
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Deprecated in the SDKs and ignored: every sandbox's envd needs its access token.
    #[serde(default)]
    pub secure: Option<bool>,
    /// Snake case on E2B's wire, unlike its neighbours.
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub auto_pause: Option<bool>,
    #[serde(default)]
    pub auto_resume: Option<Value>,
    #[serde(default)]
    pub network: Option<Value>,
    #[serde(default)]
    pub mcp: Option<Value>,
    #[serde(default)]
    pub iam: Option<Value>,
    #[serde(default)]
    pub volume_mounts: Option<Vec<Value>>,
}

impl NewSandbox {
    /// The request's fields asking for what sandgate does not do, by their wire names.
    pub fn unsupported(&self) -> Vec<&'static str> {
        let set = |value: &Option<Value>| value.as_ref().is_some_and(|v| !v.is_null());
        let mut asked = Vec::new();
        if self.auto_pause == Some(true) {
            asked.push("autoPause");
        }
        if self
            .auto_resume
            .as_ref()
            .is_some_and(|v| v.get("enabled") == Some(&Value::Bool(true)))
        {
            asked.push("autoResume");
        }
        if set(&self.network) {
            asked.push("network");
        }
        if set(&self.mcp) {
            asked.push("mcp");
        }
        if set(&self.iam) {
            asked.push("iam");
        }
        if self.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
            asked.push("volumeMounts");
        }
        asked
    }
}

/// The answer to a create or a connect (`Sandbox`).
#[derive(Debug, Clone, Serialize)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// E2B's legacy field, still required by the SDKs' parsers.
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    /// The same token again: the code interpreter SDK sends no `X-Access-Token` on its
    /// `/contexts` calls, only this one (as `E2B-Traffic-Access-Token`), so the interpreter's
    /// routes take it there too (`envd::reach_interpreter`).
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: String,
    /// `null`: the SDK then reaches envd through `E2B_SANDBOX_URL`.
    pub domain: Option<String>,
}

/// `running` or `paused` (`SandboxState`); a sandbox held for review shows as `paused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    pub fn parse(text: &str) -> Option<SandboxState> {
        match text {
            "running" => Some(SandboxState::Running),
            "paused" => Some(SandboxState::Paused),
            _ => None,
        }
    }
}

/// `GET /sandboxes/{id}` (`SandboxDetail`) and one item of `GET /v2/sandboxes`
/// (`ListedSandbox`: the same without `allowInternetAccess`, which the SDK ignores there).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub envd_version: String,
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: SandboxState,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize)]
pub struct TimeoutRequest {
    pub timeout: u64,
}

/// `POST /sandboxes/{id}/refreshes` (`duration` in seconds; absent: E2B's default).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RefreshRequest {
    #[serde(default)]
    pub duration: Option<u64>,
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect`, and the older
/// `POST /sandboxes/{id}/resume` (whose `autoPause` is ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectRequest {
    #[serde(default)]
    pub timeout: Option<u64>,
    /// `false`: resume from the disk only (a cold boot), which sandgate does not do.
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// `false`: a filesystem-only pause, which sandgate does not do (it keeps the memory).
    #[serde(default)]
    pub memory: Option<bool>,
    /// Always met: the session's runner answers or the pause fails.
    #[serde(default)]
    pub require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/fork` (`SandboxForkRequest`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ForkRequest {
    /// Seconds each fork lives from now (E2B's default: 15).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Forks to start from the one snapshot (1 to [`MAX_FORKS`]; E2B's default: 1).
    #[serde(default)]
    pub count: Option<u64>,
}

/// Most forks in one call (E2B's SDKs send at most this many).
pub const MAX_FORKS: u64 = 20;

/// One fork's outcome (`SandboxForkResult`): exactly one of the two is set.
#[derive(Debug, Clone, Serialize)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SnapshotRequest {
    /// Names are not kept: the snapshot is named by its id.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub memory: Option<bool>,
}

/// The answer to `POST /sandboxes/{id}/snapshots`: the snapshot's id is what a create names
/// as its `templateID` to start a sandbox from it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// The query of `GET /v2/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    /// `k=v&k2=v2`, each key and value percent-encoded once more (as the SDKs build it).
    #[serde(default)]
    pub metadata: Option<String>,
    /// Comma-separated states.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub next_token: Option<String>,
}

/// E2B's error body (`Error`): `code` is the HTTP status.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}
