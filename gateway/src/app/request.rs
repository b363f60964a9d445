//! What an agent asks for: the body of `POST /v1/executions`, whose wire type is in
//! `api-types`. Shared by the checks (`validate.rs`), the use case (`executions.rs`) and review
//! (`approvals.rs`).

pub use api_types::{ExecutionRequest, FileUpload};

/// Largest accepted program text.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
