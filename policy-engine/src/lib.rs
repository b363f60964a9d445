//! `policy-engine`: sandgate's typed wrapper over [regorus](https://github.com/microsoft/regorus).
//!
//! It loads a policy bundle (`policies/`: Rego files plus YAML data), compiles it once, and answers
//! one question per execution request: [`PolicyEngine::decide`] turns a [`PolicyInput`] into a
//! [`Decision`] read from the rule `data.sandgate.execution.decision`. Decisions are deserialized
//! strictly, and every failure (evaluation error, time limit, undefined or malformed decision) is a
//! deny with reason code `policy.error`: this crate never fails open and never returns an error from
//! `decide`.
//!
//! It is **not** where policy lives: what is allowed is written in Rego under `policies/`, never in
//! Rust. It does no HTTP, Docker, SQL or auditing, holds no reload logic (a reload builds a new
//! [`PolicyEngine`] and the caller swaps it in), and has no async code: `decide` is a short,
//! CPU-bound call, safe to make from many tasks at once.

mod bundle;
pub mod cases;
mod engine;
mod error;
mod hosts;
mod types;

pub use engine::{PolicyEngine, DECISION_RULE, EGRESS_RULE, EVAL_TIME_LIMIT};
pub use error::PolicyError;
pub use hosts::validate_host_pattern;
pub use types::{
    Connection, Decision, EgressDecision, EgressExecution, EgressInput, Environment, FileInput,
    HostPort, HostRule, Limits, MountGrant, NetworkGrant, PolicyInput, Principal, Reason,
    RequestInput, RequestedLimits, POLICY_ERROR_CODE,
};
