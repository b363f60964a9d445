//! `/v1/executions`: the request body, the record as clients see it, and a page of
//! the listing.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::{HostPort, Limits, Reason, RequestedLimits};
use crate::status::ExecutionStatus;

/// The body of `POST /v1/executions`. Unknown fields are refused (a typo is never ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecutionRequest {
    pub language: String,
    pub code: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileUpload>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<HostPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    #[serde(default, skip_serializing_if = "RequestedLimits::is_empty")]
    pub limits: RequestedLimits,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `false`: answer 202 as soon as it is queued (follow it on `/v1/executions/{id}/events`).
    #[serde(default = "default_wait")]
    pub wait: bool,
}

fn default_wait() -> bool {
    true
}

impl ExecutionRequest {
    /// `code` in `language`, nothing else asked for, answered when it ended.
    pub fn new(language: impl Into<String>, code: impl Into<String>) -> ExecutionRequest {
        ExecutionRequest {
            language: language.into(),
            code: code.into(),
            files: Vec::new(),
            network: Vec::new(),
            mounts: Vec::new(),
            limits: RequestedLimits::default(),
            labels: BTreeMap::new(),
            wait: true,
        }
    }
}

/// A file placed in `/workspace` before the code runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FileUpload {
    pub path: String,
    pub content_b64: String,
}

/// An execution as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutionView {
    pub id: String,
    pub status: ExecutionStatus,
    pub tenant: String,
    pub language: String,
    pub exit_code: Option<i32>,
    /// The output as text: exactly what the program wrote when that is UTF-8 (NUL included,
    /// as `\u0000`); otherwise each invalid sequence shows as U+FFFD and the exact bytes are in
    /// `stdout_base64`. Absent from listings.
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: Option<i64>,
    pub decision: DecisionView,
    pub limits: Option<Limits>,
    pub labels: BTreeMap<String, String>,
    /// The files collected from `/output`.
    pub outputs: Vec<OutputFile>,
    /// What was in `/output` but not collected, and why.
    pub outputs_skipped: Vec<SkippedOutput>,
    /// The output limit stopped collection.
    pub outputs_truncated: bool,
    /// Set once retention has purged stdout, stderr and the output files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// `warm` (a pooled sandbox) or `cold`; absent until it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<crate::SandboxStart>,
    /// The container that ran it (`sandgate-...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The session it ran in, and (python) its final expression's `repr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// In a python session: what the cell displayed, as E2B's code interpreter gives it (the
    /// final expression's MIME bundle with `is_main_result`, figures from `plt.show()` as PNG).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<CellResult>,
    /// `results` left out values that did not fit the execution's `output_bytes` (whole
    /// values are left out, never cut).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub results_truncated: bool,
    /// Its session was paused and was restored to run it (DESIGN 15).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    /// Set for status `error`; the detail stays in the gateway's log and audit store (except
    /// a record another replica closed: `closed by <instance>: owner <instance> lease expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `GET /v1/executions/{id}` only: the uploaded files, `[{"path","bytes"}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Value>,
    /// `GET /v1/executions/{id}` only: what the policy granted, `{"network","mounts"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Value>,
    /// The replica (gateway instance id) that ran it, or holds it while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// `pending_approval` answers to `POST /v1/executions`: the approval a reviewer decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// One displayed value of a cell, with E2B's `Result` field names (each MIME type's value
/// as E2B carries it: `png`, `jpeg` and `pdf` in base64, `json` as JSON, the rest text).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CellResult {
    /// The cell's final expression (`true`), or something it displayed.
    pub is_main_result: bool,
    /// `text/plain` (a string's quotes removed, as E2B does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
}

/// A cell's results as stored with its record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellResults {
    pub results: Vec<CellResult>,
    pub truncated: bool,
}

/// The policy's decision on an execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecisionView {
    pub id: String,
    pub allow: bool,
    pub backend: Option<String>,
    pub reasons: Vec<Reason>,
    pub policy_revision: String,
}

/// One collected file, downloadable with `GET /v1/executions/{id}/outputs/{path}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// Something found in `/output` that was not collected, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkippedOutput {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// `output_limit`, `symlink`, `special_file`, `bad_name`, `too_deep`, `too_many_entries`;
    /// from a live sandbox also `hardlink` and `changed`.
    pub reason: String,
}

/// `GET /v1/executions`: a page, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutionPage {
    /// Execution records without `stdout` and `stderr` (read back as empty).
    #[serde(serialize_with = "without_output")]
    pub executions: Vec<ExecutionView>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<String>,
}

/// The records as `GET /v1/executions/{id}` shows them, minus `stdout` and `stderr`.
fn without_output<S: serde::Serializer>(
    views: &[ExecutionView],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::{Error as _, SerializeSeq as _};
    let mut seq = serializer.serialize_seq(Some(views.len()))?;
    for view in views {
        let mut value = serde_json::to_value(view).map_err(S::Error::custom)?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove("stdout");
            fields.remove("stderr");
        }
        seq.serialize_element(&value)?;
    }
    seq.end()
}

#[cfg(test)]
#[path = "execution_tests.rs"]
mod tests;
