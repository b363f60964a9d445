//! The active policy bundle and its reloads. Decisions read the current bundle through an `Arc`
//! (the lock is held only to clone it, never while evaluating); a reload builds a candidate,
//! runs the bundle's own test cases, records the revision and only then swaps it in. A bundle
//! that failed to load still answers: every decision is a deny with `policy.error`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use chrono::{DateTime, Utc};
use serde_json::json;

use policy_engine::{Decision, EgressDecision, EgressInput, PolicyEngine, PolicyInput, Reason};

use super::{error_chain, AppError};
use crate::audit::{AuditStore, NewEvent};

/// Revision named on decisions made while no bundle is loaded.
pub const NO_REVISION: &str = "none";

#[derive(Debug)]
pub enum PolicyState {
    Loaded(Box<PolicyEngine>),
    Failed { error: String },
}

impl PolicyState {
    pub fn decide(&self, input: &PolicyInput) -> Decision {
        match self {
            PolicyState::Loaded(engine) => engine.decide(input),
            PolicyState::Failed { error } => unloaded(error),
        }
    }

    /// [`PolicyState::decide`] for a raw input (dry runs).
    pub fn decide_json(&self, input: &serde_json::Value) -> Decision {
        match self {
            PolicyState::Loaded(engine) => engine.decide_json(input),
            PolicyState::Failed { error } => unloaded(error),
        }
    }

    pub fn decide_egress(&self, input: &EgressInput) -> EgressDecision {
        match self {
            PolicyState::Loaded(engine) => engine.decide_egress(input),
            PolicyState::Failed { error } => EgressDecision {
                allow: false,
                reasons: unloaded(error).reasons,
                credentials: Vec::new(),
            },
        }
    }

    /// Whether the bundle's data names `tenant`; `None` when no bundle is loaded.
    pub fn knows_tenant(&self, tenant: &str) -> Option<bool> {
        match self {
            PolicyState::Loaded(engine) => Some(engine.tenants().iter().any(|t| t == tenant)),
            PolicyState::Failed { .. } => None,
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

    /// The bundle's files with their contents (none when the bundle failed to load).
    pub fn sources(&self) -> &[policy_engine::SourceFile] {
        match self {
            PolicyState::Loaded(engine) => engine.sources(),
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

/// The answer of a gateway whose bundle did not load: a deny with `policy.error`.
fn unloaded(error: &str) -> Decision {
    Decision::deny_with_error(format!("no policy bundle is loaded: {error}"))
}

/// One bundle as it was activated.
#[derive(Debug)]
pub struct ActivePolicy {
    pub state: PolicyState,
    pub loaded_by: String,
    pub loaded_at: DateTime<Utc>,
}

/// What a successful reload did.
#[derive(Debug, Clone)]
pub struct ReloadAccepted {
    pub revision: String,
    pub previous: String,
}

/// The policy directory and the bundle currently answering for it.
#[derive(Debug)]
pub struct PolicyHandle {
    dir: PathBuf,
    current: RwLock<Arc<ActivePolicy>>,
    /// Reloads run one at a time; decisions never wait for them.
    reloading: tokio::sync::Mutex<()>,
}

impl PolicyHandle {
    /// Loads the bundle at start-up. A bundle that fails to load or fails its own test cases
    /// leaves the gateway denying everything, and `/readyz` says why.
    pub async fn load(dir: &Path) -> PolicyHandle {
        let state = match candidate(dir.to_owned()).await {
            Ok(engine) => PolicyState::Loaded(Box::new(engine)),
            Err(error) => {
                tracing::error!(policy_dir = %dir.display(), error = %error, "policy bundle rejected; denying everything");
                PolicyState::Failed { error }
            }
        };
        PolicyHandle {
            dir: dir.to_owned(),
            current: RwLock::new(Arc::new(ActivePolicy {
                state,
                loaded_by: "startup".to_owned(),
                loaded_at: crate::ids::now_micros(),
            })),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bundle to decide with. Use the same `Arc` for a decision and the revision it names.
    pub fn current(&self) -> Arc<ActivePolicy> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Loads the policy directory again. The candidate must load and pass its own test cases;
    /// its revision and the reload event are committed before it answers any decision. On any
    /// failure the active bundle stays, and the error says why.
    pub async fn reload(
        &self,
        audit: &AuditStore,
        loaded_by: &str,
    ) -> Result<ReloadAccepted, ReloadError> {
        let _one_at_a_time = self.reloading.lock().await;
        let previous = self.current().state.revision().to_owned();
        let engine = match candidate(self.dir.clone()).await {
            Ok(engine) => engine,
            Err(message) => {
                let event = reload_event(loaded_by, &self.dir, &previous, None, Some(&message));
                audit.record_event(&event).await.map_err(AppError::from)?;
                tracing::warn!(loaded_by, error = %message, "policy reload rejected");
                return Err(ReloadError::Rejected {
                    message,
                    active_revision: previous,
                });
            }
        };
        let revision = engine.revision().to_owned();
        audit
            .record_policy_revision(&revision, engine.files(), loaded_by)
            .await
            .map_err(AppError::from)?;
        audit
            .record_policy_sources(&revision, engine.sources())
            .await
            .map_err(AppError::from)?;
        let event = reload_event(loaded_by, &self.dir, &previous, Some(&revision), None);
        audit.record_event(&event).await.map_err(AppError::from)?;
        let active = Arc::new(ActivePolicy {
            state: PolicyState::Loaded(Box::new(engine)),
            loaded_by: loaded_by.to_owned(),
            loaded_at: crate::ids::now_micros(),
        });
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = active;
        tracing::info!(loaded_by, %revision, %previous, "policy reloaded");
        Ok(ReloadAccepted { revision, previous })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the candidate policy bundle was rejected: {message}")]
    Rejected {
        message: String,
        active_revision: String,
    },
    #[error(transparent)]
    App(#[from] AppError),
}

/// Loads a candidate bundle and runs its own test cases (`tests/` in the bundle) off the async
/// threads. Any load error or failing case rejects it.
async fn candidate(dir: PathBuf) -> Result<PolicyEngine, String> {
    let loaded = tokio::task::spawn_blocking(move || check_bundle(&dir)).await;
    loaded.unwrap_or_else(|err| Err(format!("policy load task failed: {err}")))
}

/// Loads the bundle in `dir` and runs its test cases; the engine only if every case passes.
pub fn check_bundle(dir: &Path) -> Result<PolicyEngine, String> {
    let engine = PolicyEngine::load(dir).map_err(|err| error_chain(&err))?;
    let tests = dir.join("tests");
    if tests.is_dir() {
        let report = policy_engine::cases::run_cases(&engine, &tests)
            .map_err(|err| format!("cannot run the bundle's test cases: {}", error_chain(&err)))?;
        if report.failed() > 0 {
            return Err(format!(
                "{} of the bundle's test cases failed:\n{}",
                report.failed(),
                report.render()
            ));
        }
    }
    Ok(engine)
}

fn reload_event(
    loaded_by: &str,
    dir: &Path,
    previous: &str,
    accepted: Option<&str>,
    error: Option<&str>,
) -> NewEvent {
    let reasons: Vec<Reason> = error
        .map(|message| Reason {
            code: "policy.rejected".to_owned(),
            message: message.to_owned(),
        })
        .into_iter()
        .collect();
    NewEvent {
        kind: "policy.reload",
        execution_id: None,
        key_id: Some(loaded_by.to_owned()),
        tenant: None,
        decision_id: None,
        allow: Some(accepted.is_some()),
        reasons: json!(reasons),
        input: json!({"policy_dir": dir.display().to_string(), "loaded_by": loaded_by}),
        decision: json!({"accepted": accepted.is_some(), "revision": accepted, "previous": previous}),
        policy_revision: Some(accepted.unwrap_or(previous).to_owned()),
    }
}
