//! The active policy bundle. A bundle that failed to load still answers: every decision is a
//! deny with `policy.error`, so a broken policy can never open anything.

use std::path::Path;

use policy_engine::{Decision, PolicyEngine, PolicyInput};

/// Revision named on decisions made while no bundle is loaded.
pub const NO_REVISION: &str = "none";

#[derive(Debug)]
pub enum PolicyState {
    Loaded(Box<PolicyEngine>),
    Failed { error: String },
}

impl PolicyState {
    pub fn load(dir: &Path) -> PolicyState {
        match PolicyEngine::load(dir) {
            Ok(engine) => PolicyState::Loaded(Box::new(engine)),
            Err(err) => {
                let error = error_chain(&err);
                tracing::error!(policy_dir = %dir.display(), error = %error, "policy bundle failed to load; denying everything");
                PolicyState::Failed { error }
            }
        }
    }

    pub fn decide(&self, input: &PolicyInput) -> Decision {
        match self {
            PolicyState::Loaded(engine) => engine.decide(input),
            PolicyState::Failed { error } => {
                Decision::deny_with_error(format!("no policy bundle is loaded: {error}"))
            }
        }
    }

    pub fn revision(&self) -> &str {
        match self {
            PolicyState::Loaded(engine) => engine.revision(),
            PolicyState::Failed { .. } => NO_REVISION,
        }
    }

    pub fn files(&self) -> &[String] {
        match self {
            PolicyState::Loaded(engine) => engine.files(),
            PolicyState::Failed { .. } => &[],
        }
    }

    pub fn error(&self) -> Option<&str> {
        match self {
            PolicyState::Loaded(_) => None,
            PolicyState::Failed { error } => Some(error),
        }
    }
}

/// An error and its sources on one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
