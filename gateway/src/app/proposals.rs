//! Policy changes as reviewed proposals (issue 25): a JSON merge patch per data file of the
//! bundle, built on the active revision (its base) into a candidate bundle, tested (its YAML
//! cases and golden matrix) and replayed over recent decisions on creation; approved by a
//! principal other than its author, naming the candidate revision they were shown, which applies
//! it with compare-and-swap on the base (`PolicyHandle::reload_guarded`), or rejected with a
//! comment.
//!
//! Applying runs in a tracked task (a client that goes away does not stop it half-way). Under
//! the database's policy lock the proposal is claimed first (still open, still that candidate),
//! the base checked against this replica's and the last activated revision, the candidate (its
//! matrix rewritten) loaded like any reload as source `proposal` (kept for rollback, its files
//! stored with the revision, which every other replica follows), and the revision, the reload
//! event and the approval committed together: a concurrent approval, rejection or rebase, here
//! or on another replica, waits and then finds it closed. The configured policy directory is
//! then replaced whole with the new bundle (`app::policy_dir`), so a restart or SIGHUP loads the
//! same revision; a directory it cannot replace is left as it was and the answer says why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{json, Map, Value};

use policy_engine::Reason;

use super::policy::{
    ActivePolicy, Guard, PolicyState, Precondition, ProposalClaim, ReloadError, Source,
};
use super::proposal_candidate::{self, Candidate, CandidateError};
use super::replay::{self, Change, ChangedCase, Outcome, ReplayReport};
use super::{App, AppError};
use crate::audit::events::{self, proposals as proposal_events, proposals::ReplayCounts};
use crate::audit::proposals::{OpenCounts, ProposalOrigin, ProposalRow, ProposalStatus};
use crate::audit::{ApiKey, NewEvent};

/// Most example executions kept per kind of change.
pub const MAX_EXAMPLES: usize = 20;
/// Longest replay window, in days.
pub const MAX_DAYS: u32 = 90;
/// Most proposals one page lists.
pub const MAX_LIST: u32 = 200;
/// Longest title, rationale, justification and comment, in bytes.
pub const MAX_TEXT: usize = 4000;
/// Largest patch, as JSON text.
pub const MAX_PATCH_BYTES: usize = 64 * 1024;
/// Most recorded decisions one replay reads (the newest of its window); the evidence says when
/// the window held more.
pub const MAX_REPLAY_DECISIONS: usize = 20_000;

/// Proposal builds (a copy of the bundle, its tests, a replay of up to
/// [`MAX_REPLAY_DECISIONS`] decisions on two engines) on this replica: at most `limit` at once,
/// another refused with 429 rather than queued; and the proposals each key is opening right
/// now, reserved before the build so that concurrent requests of one key count each other
/// against its bounds (the insert holds the open bound across replicas).
pub struct Builds {
    permits: Arc<tokio::sync::Semaphore>,
    limit: u32,
    started: Arc<AtomicU64>,
    running: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
    reserved: Arc<Mutex<HashMap<String, i64>>>,
}

/// One build running: its slot is given back when dropped (after the blocking work it moves
/// into, even when the request that started it went away).
pub struct BuildSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    running: Arc<AtomicU64>,
}

impl Drop for BuildSlot {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A key's reservation of one proposal being opened; released when dropped.
pub struct Reservation {
    key: String,
    reserved: Arc<Mutex<HashMap<String, i64>>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = reserved.get_mut(&self.key) {
            *count -= 1;
            if *count <= 0 {
                reserved.remove(&self.key);
            }
        }
    }
}

impl Builds {
    pub fn new(limit: u32) -> Builds {
        Builds {
            permits: Arc::new(tokio::sync::Semaphore::new(limit as usize)),
            limit,
            started: Arc::default(),
            running: Arc::default(),
            peak: Arc::default(),
            reserved: Arc::default(),
        }
    }

    /// A slot for one build, or 429 naming the bound.
    fn start(&self) -> Result<BuildSlot, AppError> {
        let permit = Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            AppError::RateLimited(format!(
                "too many policy proposals are being built at once (at most {} per replica, \
                     proposals.concurrent_builds); try again shortly",
                self.limit
            ))
        })?;
        self.started.fetch_add(1, Ordering::Relaxed);
        let now = self.running.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(BuildSlot {
            _permit: permit,
            running: Arc::clone(&self.running),
        })
    }

    /// Reserves one proposal for `key` if `counted` (what the store holds) plus the key's
    /// reservations stays below `bound`; else the number counted with them.
    fn reserve(&self, key: &str, counted: i64, bound: i64) -> Result<Reservation, i64> {
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        let mine = reserved.get(key).copied().unwrap_or(0);
        if counted + mine >= bound {
            return Err(counted + mine);
        }
        *reserved.entry(key.to_owned()).or_default() += 1;
        Ok(Reservation {
            key: key.to_owned(),
            reserved: Arc::clone(&self.reserved),
        })
    }

    /// The Prometheus series: builds started, and the most that ever ran at once.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let started = self.started.load(Ordering::Relaxed);
        let peak = self.peak.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP sandgate_proposal_builds_started_total Policy proposal builds (candidate, \
             tests, replay) started on this replica.\n# TYPE sandgate_proposal_builds_started_total \
             counter\nsandgate_proposal_builds_started_total {started}\n# HELP \
             sandgate_proposal_builds_peak The most policy proposal builds that ran at once on \
             this replica.\n# TYPE sandgate_proposal_builds_peak gauge\n\
             sandgate_proposal_builds_peak {peak}"
        );
    }
}

/// What approving a proposal applied: the revision now active, the one before, and whether
/// the policy directory was written too. (Fields alphabetical, as the answer always had them:
/// it was a `json!` object, whose keys serde_json sorts.)
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Applied {
    /// Why the policy directory was not written (the revision is active and stored anyway).
    pub policy_dir_error: Option<String>,
    pub policy_dir_written: bool,
    pub previous: String,
    pub revision: String,
}

/// What a new proposal says (already bounded by the API).
#[derive(Debug, Clone)]
pub struct Draft {
    pub title: String,
    pub rationale: String,
    pub patch: Map<String, Value>,
    pub source_execution: Option<String>,
    pub source_approval: Option<String>,
    pub justification: Option<String>,
    pub origin: ProposalOrigin,
    pub window: Window,
}

/// What a proposal's replay reads: the last `days`, at most the newest `limit` decisions.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub days: u32,
    pub limit: usize,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            days: 7,
            limit: MAX_REPLAY_DECISIONS,
        }
    }
}

/// One example of a bucket: the execution or session whose opening was decided differently.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Example {
    pub kind: api_types::SubjectKind,
    pub id: String,
}

impl Example {
    fn of(case: &ChangedCase) -> Option<Example> {
        use api_types::SubjectKind;
        match (&case.execution_id, &case.session_id) {
            (Some(id), _) => Some(Example {
                kind: SubjectKind::Execution,
                id: id.clone(),
            }),
            (None, Some(id)) => Some(Example {
                kind: SubjectKind::Session,
                id: id.clone(),
            }),
            (None, None) => None,
        }
    }
}

/// One replay count with its first examples.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Bucket {
    pub count: usize,
    /// At most [`MAX_EXAMPLES`], each with its kind (an execution, or a session opening).
    pub examples: Vec<Example>,
}

impl Bucket {
    fn add(&mut self, example: Option<&Example>) {
        self.count += 1;
        if let Some(example) = example.filter(|_| self.examples.len() < MAX_EXAMPLES) {
            self.examples.push(example.clone());
        }
    }
}

/// What the candidate would have decided differently from its base over the last `days`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayEvidence {
    pub days: u32,
    /// The most decisions read (the newest of the window).
    pub limit: usize,
    /// Whether the window held more decisions than `limit` (the oldest were not replayed).
    pub truncated: bool,
    pub total: usize,
    pub unchanged: usize,
    pub allow_to_deny: Bucket,
    pub deny_to_allow: Bucket,
    /// Any transition to or from review.
    pub review_changes: Bucket,
    /// Allowed before and after, with another limit.
    pub limit_changes: Bucket,
    /// Allowed before and after, with another grant: hosts or ports, a rule's inspection,
    /// credentials or request rules, the network budget, mounts, or the backend.
    pub grant_changes: Bucket,
    pub candidate_errors: usize,
}

/// Summarises a replay report as a proposal's evidence: each changed decision counts once per
/// bucket it falls in.
pub fn replay_evidence(window: Window, truncated: bool, report: &ReplayReport) -> ReplayEvidence {
    let mut evidence = ReplayEvidence {
        days: window.days,
        limit: window.limit,
        truncated,
        total: report.total,
        unchanged: report.unchanged,
        candidate_errors: report.candidate_errors,
        ..ReplayEvidence::default()
    };
    for case in &report.changed {
        let example = Example::of(case);
        let (mut limits, mut grants) = (false, false);
        for change in &case.changes {
            match change {
                Change::Outcome { from, to } => match (from, to) {
                    (Outcome::Allow, Outcome::Deny) => evidence.allow_to_deny.add(example.as_ref()),
                    (Outcome::Deny, Outcome::Allow) => evidence.deny_to_allow.add(example.as_ref()),
                    _ => evidence.review_changes.add(example.as_ref()),
                },
                Change::Limit { limit, .. } if !limit.starts_with("network.") => limits = true,
                _ => grants = true,
            }
        }
        if limits {
            evidence.limit_changes.add(example.as_ref());
        }
        if grants {
            evidence.grant_changes.add(example.as_ref());
        }
    }
    evidence
}

impl App {
    /// Builds, tests and replays `draft` on the active revision, then stores it with its
    /// `policy.proposed` event. Refused: a patch outside the data, a bundle that does not load,
    /// a source approval that does not exist (or is not of the source execution), an author
    /// or tenant at its bound of open proposals (counted and inserted atomically).
    pub async fn create_proposal(
        &self,
        caller: &ApiKey,
        draft: Draft,
    ) -> Result<ProposalRow, AppError> {
        let _reserved = self.check_open_bounds(caller).await?;
        self.check_source_approval(&draft).await?;
        let active = self.policy.current();
        let base = active.state.revision().to_owned();
        let (candidate, evidence) = self.evidence(&active, &draft.patch, draft.window).await?;
        let tests_passed = candidate.tests.passed;
        let row = ProposalRow {
            id: crate::ids::new("pp"),
            created_at: crate::ids::now_micros(),
            title: draft.title,
            rationale: draft.rationale,
            author_key_id: caller.id.clone(),
            author_principal: caller.principal.clone(),
            author_tenant: caller.tenant.clone(),
            origin: draft.origin,
            justification: draft.justification,
            source_execution: draft.source_execution,
            source_approval: draft.source_approval,
            patch: sqlx::types::Json(Value::Object(draft.patch)),
            base_revision: base.clone(),
            candidate_revision: candidate.engine.revision().to_owned(),
            evidence: sqlx::types::Json(evidence),
            tests_passed,
            status: ProposalStatus::Open,
            decided_at: None,
            decided_by: None,
            comment: None,
        };
        let event = proposal_event(
            api_types::EventKind::PolicyProposed,
            &row,
            caller,
            events::column(&proposal_events::Proposed {
                status: ProposalStatus::Open,
                candidate_revision: row.candidate_revision.clone(),
                tests_passed,
                replay: ReplayCounts::of(&row.evidence.0["replay"]),
            }),
        );
        if let Some(open) = self
            .audit
            .insert_proposal(&row, &event, self.open_bounds())
            .await?
        {
            return Err(self.bounded(open));
        }
        tracing::info!(proposal = %row.id, base = %base, candidate = %row.candidate_revision, "policy proposed");
        Ok(row)
    }

    /// At most `pending_approvals.per_key` open proposals per author key and `per_tenant` per
    /// tenant, as for requests waiting for review. Refused before the candidate is built, the
    /// key's proposals being built here counted with its open ones (reserved until stored);
    /// [`crate::audit::AuditStore::insert_proposal`] holds the bound across replicas.
    async fn check_open_bounds(&self, caller: &ApiKey) -> Result<Reservation, AppError> {
        let open = self
            .audit
            .open_proposals(&caller.id, &caller.tenant)
            .await?;
        let bounds = self.open_bounds();
        if open.tenant >= bounds.tenant {
            return Err(self.bounded(open));
        }
        self.proposal_builds
            .reserve(&caller.id, open.key, bounds.key)
            .map_err(|key| self.bounded(OpenCounts { key, ..open }))
    }

    /// At most `proposals.access_requests_per_hour` proposals opened by one agent key's
    /// access-requests in any hour, those being built here counted too.
    async fn check_access_rate(&self, caller: &ApiKey) -> Result<Reservation, AppError> {
        let since = crate::ids::now_micros() - chrono::Duration::hours(1);
        let asked = self.audit.agent_proposals_since(&caller.id, since).await?;
        let limit = self.config.proposals.access_requests_per_hour;
        self.proposal_builds
            .reserve(&format!("access-request:{}", caller.id), asked, i64::from(limit))
            .map_err(|_| {
                AppError::RateLimited(format!(
                    "too many access requests from this key (at most {limit} an hour,                      proposals.access_requests_per_hour); a reviewer sees the open ones"
                ))
            })
    }

    fn open_bounds(&self) -> OpenCounts {
        let limits = &self.config.pending_approvals;
        OpenCounts {
            key: i64::from(limits.per_key),
            tenant: i64::from(limits.per_tenant),
        }
    }

    fn bounded(&self, open: OpenCounts) -> AppError {
        let limits = &self.config.pending_approvals;
        AppError::RateLimited(format!(
            "too many open proposals (at most {} per key and {} per tenant; {} and {} are open)",
            limits.per_key, limits.per_tenant, open.key, open.tenant
        ))
    }

    /// A cited approval must exist (reviewers and admins, who open proposals, see every
    /// tenant's approvals) and, with a source execution, be that execution's.
    async fn check_source_approval(&self, draft: &Draft) -> Result<(), AppError> {
        let Some(id) = &draft.source_approval else {
            return Ok(());
        };
        let approval = self
            .audit
            .get_approval(&crate::ids::ApprovalId::from(id.as_str()))
            .await?
            .ok_or_else(|| AppError::Invalid(format!("source_approval: no approval {id}")))?;
        match &draft.source_execution {
            Some(execution) if approval.execution_id.as_ref() != Some(execution) => {
                Err(AppError::Invalid(format!(
                    "source_approval {id} is not an approval of execution {execution}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The candidate of `patch` on `state` and its evidence: tests and a replay of `window`.
    async fn evidence(
        &self,
        active: &Arc<ActivePolicy>,
        patch: &Map<String, Value>,
        window: Window,
    ) -> Result<(Candidate, Value), AppError> {
        let slot = self.proposal_builds.start()?;
        let (candidate, slot) = self
            .candidate_in(&active.state, patch, false, Some(slot))
            .await?;
        let since = crate::ids::now_micros() - chrono::Duration::days(i64::from(window.days));
        let recent = self
            .audit
            .execution_decisions_recent(since, window.limit)
            .await?;
        let truncated = recent.truncated;
        let active = Arc::clone(active);
        let (candidate, report) = tokio::task::spawn_blocking(move || {
            // The slot is held until the replay ends, even if the request went away.
            let _slot = slot;
            let report = match &active.state {
                PolicyState::Loaded(base) => {
                    replay::replay_between(base, &candidate.engine, &recent.decisions)
                }
                // `candidate` refuses a state without a bundle before this runs.
                PolicyState::Failed { .. } => ReplayReport::default(),
            };
            (candidate, report)
        })
        .await
        .map_err(|err| AppError::Internal(format!("replay task: {err}")))?;
        let evidence = json!({
            "tests": candidate.tests,
            "replay": replay_evidence(window, truncated, &report),
            "files": candidate.changed,
        });
        Ok((candidate, evidence))
    }

    /// Builds the candidate of `patch` on `state`'s files in a directory of its own under
    /// `<data_dir>/policy-incoming/`, removed when the candidate is dropped.
    async fn candidate(
        &self,
        state: &PolicyState,
        patch: &Map<String, Value>,
        bless: bool,
    ) -> Result<Candidate, AppError> {
        let (candidate, _) = self.candidate_in(state, patch, bless, None).await?;
        Ok(candidate)
    }

    /// [`App::candidate`], holding `slot` (a proposal build's) in the blocking work and handing
    /// it back.
    async fn candidate_in(
        &self,
        state: &PolicyState,
        patch: &Map<String, Value>,
        bless: bool,
        slot: Option<BuildSlot>,
    ) -> Result<(Candidate, Option<BuildSlot>), AppError> {
        if let Some(error) = state.error() {
            return Err(AppError::Conflict(format!(
                "no policy bundle is active to change: {error}"
            )));
        }
        let base = state.sources().to_vec();
        let tests = self.policy.tests_of(state.revision());
        let root = self.config.data_dir.join("policy-incoming");
        let dir = super::policy::scratch_dir(&root, "proposal-").map_err(AppError::Internal)?;
        let patch = patch.clone();
        let (built, slot) = tokio::task::spawn_blocking(move || {
            let built = proposal_candidate::build(&base, &tests, &patch, dir, bless);
            (built, slot)
        })
        .await
        .map_err(|err| AppError::Internal(format!("candidate task: {err}")))?;
        let candidate = built.map_err(|err| match err {
            CandidateError::Io(message) => AppError::Internal(message),
            other => AppError::Invalid(other.to_string()),
        })?;
        Ok((candidate, slot))
    }

    /// The bundle's suggestion for execution `id`'s decision, as a draft's patch, with any
    /// limit it raises capped at the gateway's ceilings.
    pub async fn suggestion_for(
        &self,
        id: &str,
    ) -> Result<(Map<String, Value>, Vec<Reason>), AppError> {
        let (input, decision) = self.audit.execution_decision(id).await?.ok_or_else(|| {
            AppError::NotFoundWhy(format!("execution {id} has no recorded decision"))
        })?;
        let reasons: Vec<Reason> =
            serde_json::from_value(decision["reasons"].clone()).unwrap_or_default();
        let active = self.policy.current();
        let PolicyState::Loaded(engine) = &active.state else {
            return Err(AppError::Conflict("no policy bundle is active".to_owned()));
        };
        let codes: Vec<&str> = reasons.iter().map(|r| r.code.as_str()).collect();
        let codes = if codes.is_empty() {
            "none".to_owned()
        } else {
            codes.join(", ")
        };
        let none = |why: &str| {
            AppError::NoSuggestion(format!(
                "the policy bundle ({}) suggests no change for execution {id} (reasons: \
                 {codes}){why}",
                policy_engine::SUGGEST_RULE,
            ))
        };
        match engine.suggest(&input, &reasons) {
            Ok(Some(Value::Object(mut patch))) => {
                let ceilings = &self.config.ceilings;
                proposal_candidate::cap_limits(&mut patch, engine.sources(), ceilings);
                if patch.is_empty() {
                    return Err(none(" within the gateway's ceilings"));
                }
                Ok((patch, reasons))
            }
            Ok(_) => Err(none("")),
            Err(err) => Err(AppError::NoSuggestion(format!(
                "{} failed for execution {id}: {err}",
                policy_engine::SUGGEST_RULE
            ))),
        }
    }

    /// Approves an open proposal whose tests pass, by a principal other than its author who
    /// names the candidate revision they reviewed, and applies it: only while its base is the
    /// active revision here and on every replica (else `revision_conflict`). Runs to its end
    /// in a tracked task even if the caller goes away.
    pub async fn approve_proposal(
        self: &Arc<Self>,
        caller: &ApiKey,
        id: &str,
        (reviewed, comment): (String, Option<String>),
    ) -> Result<(ProposalRow, Applied), AppError> {
        let (app, caller, id) = (Arc::clone(self), caller.clone(), id.to_owned());
        let task = self
            .tasks
            .spawn(async move { app.apply_proposal(&caller, &id, (reviewed, comment)).await });
        task.await
            .map_err(|err| AppError::Internal(format!("approval task: {err}")))?
    }

    async fn apply_proposal(
        &self,
        caller: &ApiKey,
        id: &str,
        (reviewed, comment): (String, Option<String>),
    ) -> Result<(ProposalRow, Applied), AppError> {
        let row = self.open_proposal(caller, id, &reviewed).await?;
        let active = self.policy.current();
        if active.state.revision() != row.base_revision {
            return Err(conflict(&row, active.state.revision()));
        }
        let patch = row.patch.0.as_object().cloned().unwrap_or_default();
        let candidate = self.candidate(&active.state, &patch, true).await?;
        if candidate.engine.revision() != row.candidate_revision {
            return Err(AppError::Conflict(format!(
                "the candidate now reads as {}, not {}; rebase the proposal",
                candidate.engine.revision(),
                row.candidate_revision
            )));
        }
        let accepted = self.apply(caller, &row, &candidate, comment).await?;
        drop(candidate);
        self.announce_policy(&accepted.revision).await;
        let written = accepted.policy_dir.clone().unwrap_or(Ok(()));
        let applied = Applied {
            policy_dir_error: written.as_ref().err().cloned(),
            policy_dir_written: written.is_ok(),
            previous: accepted.previous,
            revision: accepted.revision,
        };
        Ok((self.get_proposal(id).await?, applied))
    }

    async fn apply(
        &self,
        caller: &ApiKey,
        row: &ProposalRow,
        candidate: &Candidate,
        comment: Option<String>,
    ) -> Result<super::policy::ReloadAccepted, AppError> {
        let event = proposal_event(
            api_types::EventKind::PolicyProposalApproved,
            row,
            caller,
            events::column(&proposal_events::Approved {
                status: ProposalStatus::Approved,
                revision: row.candidate_revision.clone(),
                previous: row.base_revision.clone(),
                comment: comment.clone(),
            }),
        );
        let claim = ProposalClaim {
            id: row.id.clone(),
            candidate: row.candidate_revision.clone(),
            by: caller.id.clone(),
            comment,
            event,
            files: candidate.files(),
        };
        let dir = candidate.path().to_owned();
        let source = Source::Proposal(dir, row.candidate_revision.clone());
        let guard = Guard {
            if_match: Some(Precondition::OneOf(vec![row.base_revision.clone()])),
            proposal: Some(claim),
        };
        match self
            .policy
            .reload_guarded(&self.audit, &caller.id, source, guard)
            .await
        {
            Ok(accepted) => Ok(accepted),
            Err(ReloadError::RevisionConflict {
                active_revision, ..
            }) => Err(conflict(row, &active_revision)),
            Err(ReloadError::Rejected { message, .. }) => Err(AppError::Conflict(format!(
                "the candidate was refused when applied: {message}"
            ))),
            Err(ReloadError::Closed(message)) => Err(AppError::Conflict(message)),
            Err(ReloadError::App(err)) => Err(err),
        }
    }

    /// Rejects an open proposal with a comment (anyone who may review, its author included).
    pub async fn reject_proposal(
        &self,
        caller: &ApiKey,
        id: &str,
        comment: String,
    ) -> Result<ProposalRow, AppError> {
        let row = self.get_proposal(id).await?;
        let event = proposal_event(
            api_types::EventKind::PolicyProposalRejected,
            &row,
            caller,
            events::column(&proposal_events::Rejected {
                status: ProposalStatus::Rejected,
                comment: comment.clone(),
            }),
        );
        let done = self
            .audit
            .decide_proposal(
                id,
                ProposalStatus::Rejected,
                (&caller.id, Some(&comment)),
                &event,
            )
            .await?;
        if !done {
            let now = self.get_proposal(id).await?;
            return Err(AppError::Conflict(format!(
                "proposal {id} is {}, not open",
                now.status
            )));
        }
        self.get_proposal(id).await
    }

    /// Builds an open proposal again on the active revision: new base, candidate, evidence,
    /// with its `policy.proposal.rebased` event.
    pub async fn rebase_proposal(
        &self,
        caller: &ApiKey,
        id: &str,
        window: Window,
    ) -> Result<ProposalRow, AppError> {
        let mut row = self.get_proposal(id).await?;
        if row.status != ProposalStatus::Open {
            return Err(AppError::Conflict(format!(
                "proposal {id} is {}, not open",
                row.status
            )));
        }
        let active = self.policy.current();
        let patch = row.patch.0.as_object().cloned().unwrap_or_default();
        let (candidate, evidence) = self.evidence(&active, &patch, window).await?;
        let (old_base, old_candidate) = (row.base_revision.clone(), row.candidate_revision.clone());
        row.base_revision = active.state.revision().to_owned();
        row.candidate_revision = candidate.engine.revision().to_owned();
        row.tests_passed = candidate.tests.passed;
        row.evidence = sqlx::types::Json(evidence);
        let event = proposal_event(
            api_types::EventKind::PolicyProposalRebased,
            &row,
            caller,
            events::column(&proposal_events::Rebased {
                status: ProposalStatus::Open,
                previous_base: old_base,
                previous_candidate: old_candidate,
                candidate_revision: row.candidate_revision.clone(),
                tests_passed: row.tests_passed,
                replay: ReplayCounts::of(&row.evidence.0["replay"]),
            }),
        );
        if !self.audit.rebase_proposal(&row, &event).await? {
            return Err(AppError::Conflict(format!(
                "proposal {id} is no longer open"
            )));
        }
        Ok(row)
    }

    pub async fn get_proposal(&self, id: &str) -> Result<ProposalRow, AppError> {
        self.audit
            .get_proposal(id)
            .await?
            .ok_or_else(|| AppError::NotFoundWhy(format!("no proposal {id}")))
    }

    /// The proposal, if `caller` may approve it as reviewed: open, another principal's, its
    /// tests passing, and its candidate still the one `reviewed` names.
    async fn open_proposal(
        &self,
        caller: &ApiKey,
        id: &str,
        reviewed: &str,
    ) -> Result<ProposalRow, AppError> {
        let row = self.get_proposal(id).await?;
        if row.status != ProposalStatus::Open {
            return Err(AppError::Conflict(format!(
                "proposal {id} is {}, not open",
                row.status
            )));
        }
        if row.author_principal == caller.principal {
            return Err(AppError::Forbidden(
                "a proposal must be approved by a principal other than its author".to_owned(),
            ));
        }
        if row.candidate_revision != reviewed {
            return Err(AppError::Conflict(format!(
                "proposal {id}'s candidate is now {} (it was rebased), not {reviewed}, the one \
                 you reviewed; review it again",
                row.candidate_revision
            )));
        }
        if !row.tests_passed {
            return Err(AppError::Conflict(format!(
                "proposal {id}'s tests fail on its candidate; it cannot be approved (rebase or reject it)"
            )));
        }
        Ok(row)
    }
}

fn conflict(row: &ProposalRow, active: &str) -> AppError {
    AppError::RevisionConflict(format!(
        "proposal {} was built on {}, but {active} is active now; rebase it \
         (POST /v1/policy/proposals/{}/rebase) to recompute its tests and replay",
        row.id, row.base_revision, row.id
    ))
}

fn proposal_event(
    kind: api_types::EventKind,
    row: &ProposalRow,
    caller: &ApiKey,
    decision: Value,
) -> NewEvent {
    NewEvent {
        kind,
        execution_id: row.source_execution.clone(),
        key_id: Some(caller.id.clone()),
        tenant: Some(caller.tenant.clone()),
        decision_id: None,
        allow: None,
        reasons: events::no_reasons(),
        input: events::column(&proposal_events::Proposal {
            proposal_id: row.id.clone(),
            title: row.title.clone(),
            origin: row.origin,
            author_key_id: row.author_key_id.clone(),
            source_execution: row.source_execution.clone(),
            source_approval: row.source_approval.clone(),
            base_revision: row.base_revision.clone(),
            patch: crate::app::refusals::bounded_json(&row.patch.0),
        }),
        decision,
        policy_revision: Some(row.base_revision.clone()),
    }
}

impl App {
    /// An agent asks for access after its own denied or held execution `id`: a proposal from
    /// the bundle's suggestion, marked `agent`, with its justification (never trusted). It
    /// changes nothing by itself. Another tenant's execution is not found.
    pub async fn request_access(
        &self,
        caller: &ApiKey,
        id: &str,
        justification: String,
    ) -> Result<ProposalRow, AppError> {
        // Bounded here, not only at the HTTP edge: the MCP tool calls this directly.
        if justification.len() > MAX_TEXT || justification.contains('\0') {
            return Err(AppError::Invalid(format!(
                "justification must be at most {MAX_TEXT} bytes, without NUL"
            )));
        }
        let row = self
            .audit
            .get_execution(id)
            .await?
            // Only the agent's own execution: another key's (of its tenant, perhaps in a session
            // it may not see) is as absent as another tenant's.
            .filter(|row| row.tenant == caller.tenant && row.key_id == caller.id)
            .ok_or(AppError::NotFound)?;
        use crate::status::ExecutionStatus;
        if !matches!(
            row.status,
            ExecutionStatus::Denied | ExecutionStatus::PendingApproval
        ) {
            return Err(AppError::Conflict(format!(
                "execution {id} is {}; access may be requested only for a denied or held one",
                row.status
            )));
        }
        let _rate = self.check_access_rate(caller).await?;
        let (patch, reasons) = self.suggestion_for(id).await?;
        let codes: Vec<&str> = reasons.iter().map(|r| r.code.as_str()).collect();
        let draft = Draft {
            title: format!("Access requested by an agent of {} after {id}", caller.tenant),
            rationale: format!(
                "The agent key {} asked for what {id} was refused ({}); the patch is the bundle's suggestion.",
                caller.id,
                codes.join(", ")
            ),
            patch,
            source_execution: Some(id.to_owned()),
            source_approval: None,
            justification: Some(justification),
            origin: ProposalOrigin::Agent,
            window: Window::default(),
        };
        self.create_proposal(caller, draft).await
    }
}
