//! The wire types of sessions, defined with the API's other wire types in the
//! `api-types` crate and re-exported here so `crate::session_wire::...` keeps its path. The
//! server serialises [`SessionView`] (and the file API's `SessionFile*`, a cell's
//! [`CellResult`]s); `sandgate repl`, `sandgate exec --session` and the MCP
//! server read it back with the same type.

pub use api_types::{
    CellResult, CellResults, ClosedReason, SessionExecutionRequest, SessionFileEntry,
    SessionFileKind, SessionFileList, SessionFileMkdir, SessionFileMove, SessionFileWritten,
    SessionList, SessionRequest, SessionStatus, SessionView, TurnLimits,
};
