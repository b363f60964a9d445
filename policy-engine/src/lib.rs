//! `policy-engine`: sandgate's typed wrapper over [regorus](https://github.com/microsoft/regorus).
//!
//! It loads a policy bundle (`policies/`: Rego files plus YAML data), validates and compiles it
//! once, and answers two questions:
//! - per execution request, [`PolicyEngine::decide`] turns a [`PolicyInput`] into a [`Decision`]
//!   read from `data.sandgate.execution.decision` (allow / deny / require approval, backend,
//!   network grant, mounts, limits);
//! - per connection through the egress proxy, [`PolicyEngine::decide_egress`] turns an
//!   [`EgressInput`] into an [`EgressDecision`] read from `data.sandgate.egress.decision`.
//!
//! Decisions are deserialized strictly, network grants are checked ([`validate_host_pattern`]),
//! and every failure (evaluation error, time limit, undefined or malformed decision, bad grant) is a
//! deny with reason code `policy.error`: this crate never fails open and never returns an error from
//! a decision. Host patterns in the bundle's data are checked at load, so a bad allowlist fails the
//! load instead. [`cases`] runs the bundle's YAML decision cases with line coverage
//! (`sandgate policy test`), and [`matrix`] checks the bundle's golden decision matrix.
//!
//! It is **not** where policy lives: what is allowed is written in Rego under `policies/`, never in
//! Rust. It does no HTTP, Docker, SQL or auditing, holds no reload logic (a reload builds a new
//! [`PolicyEngine`] and the caller swaps it in), and has no async code: a decision is a short,
//! CPU-bound call, safe to make from many tasks at once. `policies/README.md` is the contract for
//! policy authors; `benches/decide.rs` (`make bench`) measures decision latency.

mod bundle;
pub mod cases;
mod engine;
mod error;
mod hosts;
pub mod matrix;
mod patch;
mod types;

pub use bundle::{revision_of, SourceFile};
pub use engine::{PolicyEngine, DECISION_RULE, EGRESS_RULE, EVAL_TIME_LIMIT, SUGGEST_RULE};
pub use error::PolicyError;
pub use hosts::validate_host_pattern;
pub use patch::merge_patch;
pub use types::{
    Connection, Decision, E2bCall, E2bInput, EgressDecision, EgressExecution, EgressInput,
    Environment, FileInput, HostPort, HostRule, Limits, MountGrant, NetworkGrant, PolicyInput,
    Principal, Reason, RequestInput, RequestKind, RequestedLimits, SessionInput, SessionParty,
    SnapshotInput, POLICY_ERROR_CODE, SESSION_SHARED_CODE,
};
