//! The statuses of an execution record, defined with the API's wire types in the
//! `api-types` crate; re-exported here so `crate::status::ExecutionStatus` keeps its path.

pub use api_types::ExecutionStatus;
