//! The wire types of sandgate's HTTP API, in one place: the bodies clients
//! send, the answers the gateway gives, the error body, and the closed sets (statuses, roles,
//! error codes, audit event kinds) they carry. The gateway's handlers serialise these and read
//! requests with them; `sandgate exec`, `sandgate repl` and the MCP server read the answers back
//! with the same types, so a field or a spelling cannot differ between the two sides.
//!
//! Serde only (plus chrono for timestamps). The `openapi` feature adds utoipa schemas for the
//! gateway's `/v1/openapi.json`; clients leave it off. The `sqlx` feature (the gateway's store)
//! decodes the closed sets from text columns ([`UnknownText`] for a value outside the set).
//! This crate depends on no other crate of the workspace: `policy-engine` re-exports the policy
//! types it shares with the API ([`HostPort`], [`RequestedLimits`], [`Limits`], [`Reason`]).

mod approval;
mod e2b;
mod error;
mod event_kind;
mod events;
mod execution;
mod policy;
mod proposal;
mod role;
mod session;
mod session_files;
mod status;
mod stored;
mod text_forms;

pub use approval::{
    ApprovalPage, ApprovalStatus, ApprovalView, DecidedApproval, Party, Review, ReviewDecision,
    SubjectKind,
};
pub use e2b::{E2bCall, E2bInput};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use event_kind::EventKind;
pub use events::{ExitEvent, OutputEvent, StreamEventName};
pub use execution::{
    CellResult, CellResults, DecisionView, ExecutionPage, ExecutionRequest, ExecutionView,
    FileUpload, OutputFile, SkippedOutput,
};
pub use policy::{CredentialsReload, HostPort, Limits, PolicyAccepted, Reason, RequestedLimits};
pub use proposal::{AccessRequested, ProposalOrigin, ProposalStatus};
pub use role::Role;
pub use session::{
    ClosedReason, IdleAction, SandboxStart, SessionExecutionRequest, SessionList, SessionRequest,
    SessionStatus, SessionView, TurnLimits,
};
pub use session_files::{
    SessionFileEntry, SessionFileKind, SessionFileList, SessionFileMkdir, SessionFileMove,
    SessionFileWritten,
};
pub use status::ExecutionStatus;
#[cfg(feature = "sqlx")]
pub use stored::{ExecutionStart, SessionStart};
pub use stored::{TextSet, UnknownText};
