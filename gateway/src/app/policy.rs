//! The active policy bundle and its reloads. Decisions read the current bundle through an `Arc`
//! (the lock is held only to clone it, never while evaluating); a reload builds a candidate,
//! runs the bundle's own test cases, records the revision and only then swaps it in. A bundle
//! that failed to load still answers: every decision is a deny with `policy.error`.
//!
//! Across replicas: every activation but following another replica holds the database's policy
//! lock from its precondition check to its commit, and records its revision as the one last
//! activated (`policy_active`, written at start-up too), so `If-Match` and a proposal's base are
//! compared with what any replica activated last, not only with this process's bundle.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use chrono::{DateTime, Utc};

use policy_engine::{Decision, EgressDecision, EgressInput, PolicyEngine, PolicyInput, Reason};

use super::policy_revisions::{KeptRevision, RevisionStore};
use super::{error_chain, AppError};
use crate::audit::proposals::{Activated, Activation};
use crate::audit::{events, AuditStore, NewEvent};

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
                upgrade: false,
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
    /// For an applied proposal: whether the policy directory now holds it, or why not.
    pub policy_dir: Option<Result<(), String>>,
}

/// Where a reload takes its candidate from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The configured `policy_dir` (SIGHUP, `POST /v1/policy/reload` without a body).
    Configured,
    /// Another directory the gateway can read (an absolute path).
    Dir(PathBuf),
    /// A kept revision (rollback); `None`: the one active before the current one.
    Revision(Option<String>),
    /// An uploaded bundle, unpacked into this directory of its own.
    Upload(PathBuf),
    /// A revision another replica loaded, written into this directory from its stored files;
    /// it must read as that revision.
    Stored(PathBuf, String),
    /// An approved proposal's candidate, written into this directory; it must read as this
    /// revision (`app/proposals.rs`).
    Proposal(PathBuf, String),
}

/// The policy directory and the bundle currently answering for it.
#[derive(Debug)]
pub struct PolicyHandle {
    dir: PathBuf,
    current: RwLock<Arc<ActivePolicy>>,
    /// The last accepted bundles, for rollback (absent in tests that build a bare handle).
    revisions: Option<RevisionStore>,
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
            revisions: None,
        }
    }

    /// [`PolicyHandle::load`], keeping each accepted bundle in `revisions` (the start-up one
    /// too) for rollback.
    pub async fn load_keeping(dir: &Path, revisions: RevisionStore) -> PolicyHandle {
        let mut handle = PolicyHandle::load(dir).await;
        let active = handle.current();
        if let PolicyState::Loaded(engine) = &active.state {
            let kept = keep(revisions.clone(), dir.to_owned(), engine).await;
            if let Err(error) = kept {
                tracing::warn!(error = %error, "the start-up policy bundle could not be kept for rollback");
            }
        }
        handle.revisions = Some(revisions);
        handle
    }

    /// The kept revisions, the most recently active first.
    pub fn kept(&self) -> Vec<KeptRevision> {
        self.revisions
            .as_ref()
            .map(RevisionStore::list)
            .unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `tests/` of `revision` as it was kept, else the policy directory's.
    pub fn tests_of(&self, revision: &str) -> PathBuf {
        let kept = self.revisions.as_ref().and_then(|r| r.path_of(revision));
        kept.map(|dir| dir.join("tests"))
            .filter(|tests| tests.is_dir())
            .unwrap_or_else(|| self.dir.join("tests"))
    }

    /// The bundle to decide with. Use the same `Arc` for a decision and the revision it names.
    pub fn current(&self) -> Arc<ActivePolicy> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Loads the policy directory again ([`PolicyHandle::reload_from`] the configured one).
    pub async fn reload(
        &self,
        audit: &AuditStore,
        loaded_by: &str,
    ) -> Result<ReloadAccepted, ReloadError> {
        self.reload_from(audit, loaded_by, Source::Configured).await
    }

    /// Loads a candidate from `source`. It must load and pass its own test cases (a kept
    /// revision must also still be that revision); it is kept for rollback, and its revision and
    /// the reload event are committed before it answers any decision. On any failure the
    /// active bundle stays, the refusal is audited, and the error says why.
    pub async fn reload_from(
        &self,
        audit: &AuditStore,
        loaded_by: &str,
        source: Source,
    ) -> Result<ReloadAccepted, ReloadError> {
        self.reload_guarded(audit, loaded_by, source, Guard::default())
            .await
    }

    /// [`PolicyHandle::reload_from`] under `guard`. Every activation but following another
    /// replica ([`Source::Stored`]) holds the database's policy lock from its check to its
    /// commit ([`AuditStore::begin_activation`]): with `if_match`, it applies only while the
    /// precondition holds for this replica's active revision and for the one last activated
    /// on any replica (compare-and-swap across replicas); with `proposal`, the proposal is
    /// claimed first and its approval committed with the revision, or nothing is. The policy
    /// directory is written (a proposal's) under the reload lock, after the commit.
    pub async fn reload_guarded(
        &self,
        audit: &AuditStore,
        loaded_by: &str,
        source: Source,
        guard: Guard,
    ) -> Result<ReloadAccepted, ReloadError> {
        let _one_at_a_time = self.reloading.lock().await;
        let previous = self.current().state.revision().to_owned();
        let context = ReloadContext {
            loaded_by: loaded_by.to_owned(),
            source: source_name(&source),
            previous: previous.clone(),
            proposal: guard.proposal.as_ref().map(|claim| claim.id.clone()),
        };
        let mut activation = match source {
            Source::Stored(..) => None,
            _ => Some(audit.begin_activation().await.map_err(AppError::from)?),
        };
        if let Some(activation) = activation.as_mut() {
            self.check_guard(audit, &context, activation, &guard)
                .await?;
        }
        let (dir, engine) = self.load_source(audit, &context, &source).await?;
        let revision = engine.revision().to_owned();
        audit
            .record_policy_revision(&revision, engine.files(), loaded_by)
            .await
            .map_err(AppError::from)?;
        audit
            .record_policy_sources(&revision, engine.sources())
            .await
            .map_err(AppError::from)?;
        let event = context.event(&dir, Some(&revision), None);
        let approval = guard.proposal.as_ref().map(|claim| &claim.event);
        context
            .commit(audit, activation, &revision, (&event, approval))
            .await?;
        self.swap_in(engine, loaded_by);
        tracing::info!(loaded_by, %revision, %previous, "policy reloaded");
        let policy_dir = match &guard.proposal {
            Some(claim) => Some(self.write_back(claim, &revision).await),
            None => None,
        };
        Ok(ReloadAccepted {
            revision,
            previous,
            policy_dir,
        })
    }

    /// Under the policy lock: claims the proposal, then checks `if_match` against this
    /// replica's active revision and the one last activated on any replica. On a refusal the
    /// activation is dropped (nothing written but the refusal's event).
    async fn check_guard(
        &self,
        audit: &AuditStore,
        context: &ReloadContext,
        activation: &mut Activation,
        guard: &Guard,
    ) -> Result<(), ReloadError> {
        if let Some(claim) = &guard.proposal {
            let by = (claim.by.as_str(), claim.comment.as_deref());
            let claimed = activation
                .claim_proposal(&claim.id, &claim.candidate, by)
                .await
                .map_err(AppError::from)?;
            if claimed.is_none() {
                return Err(ReloadError::Closed(format!(
                    "proposal {} is no longer open with candidate {} (it was decided or rebased meanwhile)",
                    claim.id, claim.candidate
                )));
            }
        }
        let Some(precondition) = &guard.if_match else {
            return Ok(());
        };
        let local = context.previous.as_str();
        let cluster = activation
            .active
            .clone()
            .unwrap_or_else(|| local.to_owned());
        let failed = [local, cluster.as_str()]
            .into_iter()
            .find(|revision| !precondition.matches(revision));
        let Some(active_revision) = failed else {
            return Ok(());
        };
        let message = precondition.refusal(local, &cluster);
        let _audited = context.reject(audit, &self.dir, message.clone()).await;
        Err(ReloadError::RevisionConflict {
            message,
            active_revision: active_revision.to_owned(),
        })
    }

    /// The candidate of `source`, loaded, tested and kept for rollback; refusals are audited.
    async fn load_source(
        &self,
        audit: &AuditStore,
        context: &ReloadContext,
        source: &Source,
    ) -> Result<(PathBuf, PolicyEngine), ReloadError> {
        let (dir, wanted) = match self.resolve(source, &context.previous) {
            Ok(found) => found,
            Err(message) => return Err(context.reject(audit, &self.dir, message).await),
        };
        let engine = match checked_candidate(dir.clone(), wanted).await {
            Ok(engine) => engine,
            Err(message) => return Err(context.reject(audit, &dir, message).await),
        };
        if let Some(revisions) = self.revisions.clone() {
            let kept = keep(revisions, dir.clone(), &engine).await;
            if let Err(error) = kept {
                let message = format!("the bundle could not be kept for rollback: {error}");
                return Err(context.reject(audit, &dir, message).await);
            }
        }
        Ok((dir, engine))
    }

    fn swap_in(&self, engine: PolicyEngine, loaded_by: &str) {
        let active = Arc::new(ActivePolicy {
            state: PolicyState::Loaded(Box::new(engine)),
            loaded_by: loaded_by.to_owned(),
            loaded_at: crate::ids::now_micros(),
        });
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = active;
    }

    /// Writes an applied proposal into the policy directory (still under the reload lock, so
    /// no reload of this replica reads it half-way): `Err` says why it was left as it was.
    async fn write_back(&self, claim: &ProposalClaim, revision: &str) -> Result<(), String> {
        let (dir, files, revision) = (self.dir.clone(), claim.files.clone(), revision.to_owned());
        let written = tokio::task::spawn_blocking(move || {
            super::policy_dir::replace(&dir, &files, &revision)
        })
        .await
        .unwrap_or_else(|err| Err(format!("write task: {err}")));
        if let Err(err) = &written {
            tracing::warn!(policy_dir = %self.dir.display(), error = %err, "an applied proposal was not written to the policy directory; the revision is active and kept");
        }
        written
    }

    /// Unpacks an uploaded gzip'd tar bundle into a fresh directory under `incoming` and
    /// reloads from it (source `upload`); the unpacked copy is removed afterwards (an accepted
    /// bundle is kept in the revision store). A bad archive is a refusal like any other.
    pub async fn reload_upload(
        &self,
        audit: &AuditStore,
        loaded_by: &str,
        bytes: Vec<u8>,
        incoming: &Path,
    ) -> Result<ReloadAccepted, ReloadError> {
        // Removed when dropped, on every path (a client that goes away included).
        let unpacked_dir = match scratch_dir(incoming, "upload-") {
            Ok(dir) => dir,
            Err(err) => return Err(ReloadError::App(AppError::Internal(err))),
        };
        let dir = unpacked_dir.path().join("bundle");
        let target = dir.clone();
        let unpacked =
            tokio::task::spawn_blocking(move || super::policy_upload::unpack(&bytes, &target))
                .await
                .unwrap_or_else(|err| Err(format!("unpack task failed: {err}")));
        match unpacked {
            Ok(()) => {
                self.reload_from(audit, loaded_by, Source::Upload(dir.clone()))
                    .await
            }
            Err(message) => {
                let context = ReloadContext {
                    loaded_by: loaded_by.to_owned(),
                    source: "upload",
                    previous: self.current().state.revision().to_owned(),
                    proposal: None,
                };
                let message = format!("the uploaded bundle was refused: {message}");
                Err(context.reject(audit, &dir, message).await)
            }
        }
    }

    /// The directory a source names, and the revision it must be (rollback).
    fn resolve(&self, source: &Source, current: &str) -> Result<(PathBuf, Option<String>), String> {
        match source {
            Source::Configured => Ok((self.dir.clone(), None)),
            Source::Dir(dir) if !dir.is_absolute() => Err(format!(
                "dir must be an absolute path the gateway can read, not {}",
                dir.display()
            )),
            Source::Dir(dir) if !dir.is_dir() => Err(format!(
                "{} is not a directory the gateway can read",
                dir.display()
            )),
            Source::Dir(dir) | Source::Upload(dir) => Ok((dir.clone(), None)),
            Source::Stored(dir, revision) | Source::Proposal(dir, revision) => {
                Ok((dir.clone(), Some(revision.clone())))
            }
            Source::Revision(wanted) => {
                let Some(revisions) = &self.revisions else {
                    return Err("this gateway keeps no revisions".to_owned());
                };
                let kept: Vec<String> = revisions.list().into_iter().map(|k| k.revision).collect();
                let wanted = match wanted {
                    Some(wanted) => wanted.clone(),
                    None => revisions
                        .previous(current)
                        .ok_or_else(|| "no earlier revision is kept to roll back to".to_owned())?,
                };
                let dir = revisions.path_of(&wanted).ok_or_else(|| {
                    format!("revision {wanted} is not kept; kept: {}", kept.join(", "))
                })?;
                Ok((dir, Some(wanted)))
            }
        }
    }
}

/// What the egress proxy's seams ask of the active bundle.
impl crate::egress::EgressBundle for PolicyHandle {
    fn decide_egress(&self, input: &EgressInput) -> EgressDecision {
        self.current().state.decide_egress(input)
    }

    fn revision(&self) -> String {
        self.current().state.revision().to_owned()
    }
}

/// One reload, for its audit events.
struct ReloadContext {
    loaded_by: String,
    source: &'static str,
    previous: String,
    proposal: Option<String>,
}

/// A reload's precondition and what it applies.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// The revision that must be active (`If-Match`, a proposal's base); else 409.
    pub if_match: Option<Precondition>,
    /// The approved proposal this reload applies, named in its event.
    pub proposal: Option<ProposalClaim>,
}

/// `If-Match` as RFC 9110 (13.1.1) reads it, with revisions as entity tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// `*`: any loaded revision.
    Any,
    /// One of these revisions (strong tags; a weak tag `W/"..."` never matches `If-Match`, so
    /// it is left out: only weak tags is an empty list, which nothing matches).
    OneOf(Vec<String>),
}

impl Precondition {
    pub fn matches(&self, revision: &str) -> bool {
        match self {
            Precondition::Any => revision != NO_REVISION,
            Precondition::OneOf(tags) => tags.iter().any(|tag| tag == revision),
        }
    }

    fn refusal(&self, local: &str, cluster: &str) -> String {
        let wanted = match self {
            Precondition::Any => "any loaded revision (*)".to_owned(),
            Precondition::OneOf(tags) if tags.is_empty() => {
                "no strong revision (a weak tag W/\"...\" never matches If-Match)".to_owned()
            }
            Precondition::OneOf(tags) => tags.join(" or "),
        };
        if local == cluster {
            format!("the active revision is {local}, not {wanted}")
        } else {
            format!(
                "this replica runs {local} and the revision last activated on any replica is \
                 {cluster}; the precondition wants {wanted}"
            )
        }
    }
}

/// An approved proposal a reload applies: claimed under the policy lock (it must still be open
/// with this candidate), its approval event committed with the revision.
#[derive(Debug, Clone)]
pub struct ProposalClaim {
    pub id: String,
    /// The candidate revision the reviewer approved.
    pub candidate: String,
    pub by: String,
    pub comment: Option<String>,
    /// `policy.proposal.approved`.
    pub event: NewEvent,
    /// The files it changes (data files, the rewritten matrix), relative to the policy
    /// directory, written there once applied.
    pub files: Vec<(String, Vec<u8>)>,
}

fn source_name(source: &Source) -> &'static str {
    match source {
        Source::Configured => "policy_dir",
        Source::Dir(_) => "dir",
        Source::Revision(_) => "rollback",
        Source::Upload(_) => "upload",
        Source::Stored(..) => "replica",
        Source::Proposal(..) => "proposal",
    }
}

impl ReloadContext {
    fn event(&self, dir: &Path, accepted: Option<&str>, error: Option<&str>) -> NewEvent {
        let mut event = reload_event(
            &self.loaded_by,
            (self.source, dir),
            &self.previous,
            accepted,
            error,
        );
        if let Some(proposal) = &self.proposal {
            event.input["proposal"] = serde_json::Value::from(proposal.as_str());
        }
        event
    }

    /// Commits an accepted reload: under an activation, the revision as the last activated
    /// with its event and the approval's, together; a followed one (no activation), its event.
    async fn commit(
        &self,
        audit: &AuditStore,
        activation: Option<Activation>,
        revision: &str,
        (event, approval): (&NewEvent, Option<&NewEvent>),
    ) -> Result<(), ReloadError> {
        let committed = match activation {
            Some(activation) => {
                let active = Activated {
                    revision,
                    loaded_by: &self.loaded_by,
                    source: self.source,
                    proposal: self.proposal.as_deref(),
                };
                let events: Vec<&NewEvent> = std::iter::once(event).chain(approval).collect();
                activation.commit(&active, &events).await
            }
            None => audit.record_event(event).await.map(drop),
        };
        committed.map_err(|err| ReloadError::App(AppError::from(err)))
    }

    /// Audits the refusal and says why; the active bundle stays.
    async fn reject(&self, audit: &AuditStore, dir: &Path, message: String) -> ReloadError {
        let event = self.event(dir, None, Some(&message));
        if let Err(err) = audit.record_event(&event).await {
            return ReloadError::App(AppError::from(err));
        }
        tracing::warn!(loaded_by = %self.loaded_by, error = %message, "policy reload rejected");
        ReloadError::Rejected {
            message,
            active_revision: self.previous.clone(),
        }
    }
}

/// Keeps `engine`'s bundle (loaded from `dir`) in `revisions`, off the async threads.
async fn keep(revisions: RevisionStore, dir: PathBuf, engine: &PolicyEngine) -> Result<(), String> {
    let (revision, files) = (engine.revision().to_owned(), engine.files().to_vec());
    tokio::task::spawn_blocking(move || revisions.keep_active(&dir, &revision, &files))
        .await
        .map_err(|err| err.to_string())?
        .map_err(|err| err.to_string())
}

/// [`candidate`], which must be revision `wanted` when one is named.
async fn checked_candidate(dir: PathBuf, wanted: Option<String>) -> Result<PolicyEngine, String> {
    let engine = candidate(dir).await?;
    match wanted {
        Some(wanted) if engine.revision() != wanted => Err(format!(
            "the copy of {wanted} reads as {}; not activated",
            engine.revision()
        )),
        _ => Ok(engine),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the candidate policy bundle was rejected: {message}")]
    Rejected {
        message: String,
        active_revision: String,
    },
    /// `If-Match` (or a proposal's base) is not the active revision; nothing changed.
    #[error("revision conflict: {message}")]
    RevisionConflict {
        message: String,
        active_revision: String,
    },
    /// The proposal to apply was decided or rebased meanwhile; nothing changed.
    #[error("{0}")]
    Closed(String),
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
    (source, dir): (&str, &Path),
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
        kind: api_types::EventKind::PolicyReload,
        execution_id: None,
        key_id: Some(loaded_by.to_owned()),
        tenant: None,
        decision_id: None,
        allow: Some(accepted.is_some()),
        reasons: events::column(&reasons),
        input: events::column(&events::policy::Reload {
            source: source.to_owned(),
            policy_dir: dir.display().to_string(),
            loaded_by: loaded_by.to_owned(),
        }),
        decision: events::column(&events::policy::Reloaded {
            accepted: accepted.is_some(),
            revision: accepted.map(str::to_owned),
            previous: previous.to_owned(),
        }),
        policy_revision: Some(accepted.unwrap_or(previous).to_owned()),
    }
}

/// A new directory under `root` (created if missing), removed with its contents when the guard
/// is dropped: a candidate's or an upload's copy goes on every path, a dropped request's too.
pub fn scratch_dir(root: &Path, prefix: &str) -> Result<tempfile::TempDir, String> {
    std::fs::create_dir_all(root).map_err(|err| format!("{}: {err}", root.display()))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(root)
        .map_err(|err| format!("{}: {err}", root.display()))
}

/// Removes what a process that stopped abruptly left in `root` (`<data_dir>/policy-incoming/`:
/// candidates', uploads' and followed bundles' copies). Called at start-up, before anything
/// creates one. Returns how many entries went.
pub fn sweep_scratch(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot remove a left scratch copy")
            }
        }
    }
    removed
}

/// At start-up: the scratch copies and policy-directory staging copies a process that stopped
/// abruptly left behind are removed (nothing creates one yet).
pub fn sweep_at_startup(data_dir: &Path, policy_dir: &Path) {
    let scratch = sweep_scratch(&data_dir.join("policy-incoming"));
    let staging = super::policy_dir::sweep(policy_dir);
    if scratch + staging > 0 {
        tracing::info!(
            scratch,
            staging,
            "removed copies an earlier run left behind"
        );
    }
}
