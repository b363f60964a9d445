//! The wire types of sessions, defined with the API's other wire types in the
//! `api-types` crate and re-exported here so `crate::session_wire::...` keeps its path. The
//! server serialises [`SessionView`]; `sandgate repl`, `sandgate exec --session` and the MCP
//! server read it back with the same type.

pub use api_types::{
    ClosedReason, IdleAction, SessionExecutionRequest, SessionList, SessionRequest, SessionStatus,
    SessionView, TurnLimits,
};
