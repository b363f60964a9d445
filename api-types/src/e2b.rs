//! `request.e2b` of the policy input: what the E2B-compatible API (`/e2b`, DESIGN section 14)
//! adds to a session or a session execution it asks for. Never on sandgate's own wire: the
//! session request types carry it only from the E2B layer to the policy input.

use serde::{Deserialize, Serialize};

/// `request.e2b`: present only for requests that came through `/e2b`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2bInput {
    /// The E2B template asked for (`request.kind: "session"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// `allow_internet_access` as the SDK sent it (`false`: the gateway grants no network
    /// whatever the policy says; `true` or absent: at most what the policy grants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// The SDK call (`request.kind: "session_execution"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<E2bCall>,
    /// The code context a `run_code` cell runs in (`cx_...`, from `create_code_context`);
    /// absent: the sandbox's default context, its session's runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

/// `request.e2b.call`: which SDK call started a session execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum E2bCall {
    #[serde(rename = "commands.run")]
    CommandsRun,
    #[serde(rename = "run_code")]
    RunCode,
    /// `pty.create`: an interactive terminal (`process.Process/Start` with `pty`).
    #[serde(rename = "pty.create")]
    PtyCreate,
}
