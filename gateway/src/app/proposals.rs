//! Policy changes as reviewed proposals (issue 25): a JSON merge patch per data file of the
//! bundle, built on the active revision (its base) into a candidate bundle, tested (its YAML
//! cases and golden matrix) and replayed over recent decisions on creation; approved by a
//! principal other than its author, which applies it with compare-and-swap on the base
//! (`PolicyHandle::reload_guarded`), or rejected with a comment.
//!
//! Applying: the candidate (with its matrix rewritten) is loaded like any reload, as source
//! `proposal`, so it is kept for rollback, its files are stored with the revision and every
//! other replica follows it from there; the patched data files (and the matrix) are then written
//! into the configured policy directory, each atomically (a temporary file renamed over it), so
//! a restart or SIGHUP loads the same revision. A policy directory the gateway cannot write
//! (a read-only mount) leaves the revision active and says so in the answer.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Map, Value};

use policy_engine::Reason;

use super::policy::{Guard, PolicyState, ReloadError, Source};
use super::proposal_candidate::{self, Candidate, CandidateError};
use super::replay::{self, Change, Outcome, ReplayReport};
use super::{App, AppError};
use crate::audit::proposals::{ProposalRow, ProposalStatus};
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

/// Who opened a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Reviewer,
    Agent,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Reviewer => "reviewer",
            Origin::Agent => "agent",
        }
    }
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
    pub origin: Origin,
    pub days: u32,
}

/// One replay count with its first examples.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Bucket {
    pub count: usize,
    /// Execution ids (or session ids), at most [`MAX_EXAMPLES`].
    pub examples: Vec<String>,
}

impl Bucket {
    fn add(&mut self, id: Option<&String>) {
        self.count += 1;
        if let Some(id) = id.filter(|_| self.examples.len() < MAX_EXAMPLES) {
            self.examples.push(id.clone());
        }
    }
}

/// What the candidate would have decided differently over the last `days`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayEvidence {
    pub days: u32,
    pub total: usize,
    pub unchanged: usize,
    pub allow_to_deny: Bucket,
    pub deny_to_allow: Bucket,
    /// Any transition to or from review.
    pub review_changes: Bucket,
    /// Allowed before and after, with another limit.
    pub limit_changes: Bucket,
    pub candidate_errors: usize,
}

/// Summarises a replay report as a proposal's evidence.
pub fn replay_evidence(days: u32, report: &ReplayReport) -> ReplayEvidence {
    let mut evidence = ReplayEvidence {
        days,
        total: report.total,
        unchanged: report.unchanged,
        candidate_errors: report.candidate_errors,
        ..ReplayEvidence::default()
    };
    for case in &report.changed {
        let id = case.execution_id.as_ref().or(case.session_id.as_ref());
        for change in &case.changes {
            match change {
                Change::Outcome { from, to } => match (from, to) {
                    (Outcome::Allow, Outcome::Deny) => evidence.allow_to_deny.add(id),
                    (Outcome::Deny, Outcome::Allow) => evidence.deny_to_allow.add(id),
                    _ => evidence.review_changes.add(id),
                },
                Change::Limit { limit, .. } if !limit.starts_with("network.") => {
                    evidence.limit_changes.add(id);
                    break;
                }
                _ => {}
            }
        }
    }
    evidence
}

impl App {
    /// Builds, tests and replays `draft` on the active revision, then stores it with its
    /// `policy.proposed` event. Refused: a patch outside the data, a bundle that does not load.
    pub async fn create_proposal(
        &self,
        caller: &ApiKey,
        draft: Draft,
    ) -> Result<ProposalRow, AppError> {
        self.check_open_bounds(caller).await?;
        let active = self.policy.current();
        let base = active.state.revision().to_owned();
        let (candidate, evidence) = self
            .evidence(&active.state, &draft.patch, draft.days)
            .await?;
        let tests_passed = candidate.tests.passed;
        let row = ProposalRow {
            id: crate::ids::new("pp"),
            created_at: crate::ids::now_micros(),
            title: draft.title,
            rationale: draft.rationale,
            author_key_id: caller.id.clone(),
            author_principal: caller.principal.clone(),
            author_tenant: caller.tenant.clone(),
            origin: draft.origin.as_str().to_owned(),
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
            json!({
                "status": "open",
                "candidate_revision": row.candidate_revision,
                "tests_passed": tests_passed,
                "replay": summary(&row.evidence.0["replay"]),
            }),
        );
        self.audit.insert_proposal(&row, &event).await?;
        tracing::info!(proposal = %row.id, base = %base, candidate = %row.candidate_revision, "policy proposed");
        Ok(row)
    }

    /// At most `pending_approvals.per_key` open proposals per author key and `per_tenant` per
    /// tenant, as for requests waiting for review.
    async fn check_open_bounds(&self, caller: &ApiKey) -> Result<(), AppError> {
        let open = self
            .audit
            .open_proposals(&caller.id, &caller.tenant)
            .await?;
        let limits = &self.config.pending_approvals;
        if open.key >= i64::from(limits.per_key) || open.tenant >= i64::from(limits.per_tenant) {
            return Err(AppError::RateLimited(format!(
                "too many open proposals (at most {} per key and {} per tenant)",
                limits.per_key, limits.per_tenant
            )));
        }
        Ok(())
    }

    /// The candidate of `patch` on `state` and its evidence: tests and a replay of `days`.
    async fn evidence(
        &self,
        state: &PolicyState,
        patch: &Map<String, Value>,
        days: u32,
    ) -> Result<(Candidate, Value), AppError> {
        let candidate = self.candidate(state, patch, false).await?;
        let since = crate::ids::now_micros() - chrono::Duration::days(i64::from(days));
        let stored = self.audit.execution_decisions_since(since).await?;
        let (candidate, report) = tokio::task::spawn_blocking(move || {
            let report = replay::replay(&candidate.engine, &stored);
            (candidate, report)
        })
        .await
        .map_err(|err| AppError::Internal(format!("replay task: {err}")))?;
        remove_dir(&candidate.dir).await;
        let evidence = json!({
            "tests": candidate.tests,
            "replay": replay_evidence(days, &report),
            "files": candidate.changed,
        });
        Ok((candidate, evidence))
    }

    /// Builds the candidate of `patch` on `state`'s files in a directory of its own under
    /// `<data_dir>/policy-incoming/` (removed by the caller).
    async fn candidate(
        &self,
        state: &PolicyState,
        patch: &Map<String, Value>,
        bless: bool,
    ) -> Result<Candidate, AppError> {
        if let Some(error) = state.error() {
            return Err(AppError::Conflict(format!(
                "no policy bundle is active to change: {error}"
            )));
        }
        let base = state.sources().to_vec();
        let tests = self.policy.tests_of(state.revision());
        let dir = incoming(&self.config.data_dir);
        let (patch, target) = (patch.clone(), dir.clone());
        let built = tokio::task::spawn_blocking(move || {
            proposal_candidate::build(&base, &tests, &patch, &target, bless)
        })
        .await
        .map_err(|err| AppError::Internal(format!("candidate task: {err}")))?;
        match built {
            Ok(candidate) => Ok(candidate),
            Err(err) => {
                remove_dir(&dir).await;
                Err(match err {
                    CandidateError::Io(message) => AppError::Internal(message),
                    other => AppError::Invalid(other.to_string()),
                })
            }
        }
    }

    /// The bundle's suggestion for execution `id`'s decision, as a draft's patch.
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
        match engine.suggest(&input, &reasons) {
            Ok(Some(Value::Object(patch))) => Ok((patch, reasons)),
            Ok(_) => Err(AppError::NoSuggestion(format!(
                "the policy bundle ({}) suggests no change for execution {id} (reasons: {})",
                policy_engine::SUGGEST_RULE,
                if codes.is_empty() {
                    "none".to_owned()
                } else {
                    codes.join(", ")
                }
            ))),
            Err(err) => Err(AppError::NoSuggestion(format!(
                "{} failed for execution {id}: {err}",
                policy_engine::SUGGEST_RULE
            ))),
        }
    }

    /// Approves an open proposal whose tests pass, by a principal other than its author, and
    /// applies it: only while its base is the active revision (else `revision_conflict`).
    pub async fn approve_proposal(
        &self,
        caller: &ApiKey,
        id: &str,
        comment: Option<String>,
    ) -> Result<(ProposalRow, Value), AppError> {
        let row = self.open_proposal(caller, id).await?;
        if !row.tests_passed {
            return Err(AppError::Conflict(format!(
                "proposal {id}'s tests fail on its candidate; it cannot be approved (rebase or reject it)"
            )));
        }
        let active = self.policy.current();
        if active.state.revision() != row.base_revision {
            return Err(conflict(&row, active.state.revision()));
        }
        let patch = row.patch.0.as_object().cloned().unwrap_or_default();
        let candidate = self.candidate(&active.state, &patch, true).await?;
        let applied = self.apply(caller, &row, &candidate).await;
        // The policy dir is written from the candidate (data and blessed matrix) before the
        // candidate's copy goes.
        let written = match &applied {
            Ok(_) => write_policy_dir(self.policy.dir(), &candidate).await,
            Err(_) => Ok(()),
        };
        remove_dir(&candidate.dir).await;
        let accepted = applied?;
        let event = proposal_event(
            api_types::EventKind::PolicyProposalApproved,
            &row,
            caller,
            json!({
                "status": "approved",
                "revision": accepted.revision,
                "previous": accepted.previous,
                "comment": comment,
            }),
        );
        self.audit
            .decide_proposal(
                id,
                ProposalStatus::Approved,
                (&caller.id, comment.as_deref()),
                &event,
            )
            .await?;
        self.announce_policy(&accepted.revision).await;
        let applied = json!({
            "revision": accepted.revision,
            "previous": accepted.previous,
            "policy_dir_written": written.is_ok(),
            "policy_dir_error": written.err(),
        });
        let row = self
            .audit
            .get_proposal(id)
            .await?
            .ok_or(AppError::NotFound)?;
        Ok((row, applied))
    }

    async fn apply(
        &self,
        caller: &ApiKey,
        row: &ProposalRow,
        candidate: &Candidate,
    ) -> Result<super::policy::ReloadAccepted, AppError> {
        if candidate.engine.revision() != row.candidate_revision {
            return Err(AppError::Conflict(format!(
                "the candidate now reads as {}, not {}; rebase the proposal",
                candidate.engine.revision(),
                row.candidate_revision
            )));
        }
        let source = Source::Proposal(candidate.dir.clone(), row.candidate_revision.clone());
        let guard = Guard {
            if_match: Some(row.base_revision.clone()),
            proposal: Some(row.id.clone()),
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
            json!({
                "status": "rejected",
                "comment": comment,
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
            return Err(AppError::Conflict(format!(
                "proposal {id} is {}, not open",
                row.status
            )));
        }
        self.get_proposal(id).await
    }

    /// Builds an open proposal again on the active revision: new base, candidate, evidence.
    pub async fn rebase_proposal(&self, id: &str, days: u32) -> Result<ProposalRow, AppError> {
        let mut row = self.get_proposal(id).await?;
        if row.status != ProposalStatus::Open {
            return Err(AppError::Conflict(format!(
                "proposal {id} is {}, not open",
                row.status
            )));
        }
        let active = self.policy.current();
        let patch = row.patch.0.as_object().cloned().unwrap_or_default();
        let (candidate, evidence) = self.evidence(&active.state, &patch, days).await?;
        row.base_revision = active.state.revision().to_owned();
        row.candidate_revision = candidate.engine.revision().to_owned();
        row.tests_passed = candidate.tests.passed;
        row.evidence = sqlx::types::Json(evidence);
        if !self.audit.rebase_proposal(&row).await? {
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

    async fn open_proposal(&self, caller: &ApiKey, id: &str) -> Result<ProposalRow, AppError> {
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

/// Counts of a replay evidence, for the audit event.
fn summary(replay: &Value) -> Value {
    let count = |name: &str| replay[name]["count"].clone();
    json!({
        "days": replay["days"],
        "total": replay["total"],
        "allow_to_deny": count("allow_to_deny"),
        "deny_to_allow": count("deny_to_allow"),
        "review_changes": count("review_changes"),
        "limit_changes": count("limit_changes"),
    })
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
        reasons: json!([]),
        input: json!({
            "proposal_id": row.id,
            "title": row.title,
            "origin": row.origin,
            "author_key_id": row.author_key_id,
            "source_execution": row.source_execution,
            "source_approval": row.source_approval,
            "base_revision": row.base_revision,
            "patch": crate::app::refusals::bounded_json(&row.patch.0),
        }),
        decision,
        policy_revision: Some(row.base_revision.clone()),
    }
}

fn incoming(data_dir: &Path) -> PathBuf {
    data_dir
        .join("policy-incoming")
        .join(uuid::Uuid::new_v4().to_string())
}

async fn remove_dir(dir: &Path) {
    if let Err(err) = tokio::fs::remove_dir_all(dir).await {
        tracing::warn!(dir = %dir.display(), error = %err, "cannot remove a candidate bundle's copy");
    }
}

/// Writes the applied proposal's data files and matrix into `policy_dir`, each atomically.
async fn write_policy_dir(policy_dir: &Path, candidate: &Candidate) -> Result<(), String> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = candidate
        .changed
        .iter()
        .map(|file| {
            (
                PathBuf::from(&file.path),
                file.contents.clone().into_bytes(),
            )
        })
        .collect();
    let matrix = candidate.dir.join(policy_engine::matrix::MATRIX_FILE);
    if let Ok(bytes) = tokio::fs::read(&matrix).await {
        files.push((PathBuf::from(policy_engine::matrix::MATRIX_FILE), bytes));
    }
    let dir = policy_dir.to_owned();
    let written = tokio::task::spawn_blocking(move || {
        files
            .iter()
            .try_for_each(|(rel, bytes)| replace_file(&dir.join(rel), bytes))
    })
    .await
    .unwrap_or_else(|err| Err(format!("write task: {err}")));
    if let Err(err) = &written {
        tracing::warn!(policy_dir = %policy_dir.display(), error = %err, "an applied proposal could not be written to the policy directory; the revision is active and kept");
    }
    written
}

/// `path`'s contents replaced by a temporary file renamed over it.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let parent = path
        .parent()
        .ok_or_else(|| format!("{} has no parent", path.display()))?;
    let temp = parent.join(format!(".sandgate-{}", uuid::Uuid::new_v4()));
    std::fs::write(&temp, bytes)
        .and_then(|()| std::fs::rename(&temp, path))
        .map_err(|err| {
            let _ = std::fs::remove_file(&temp);
            format!("{}: {err}", path.display())
        })
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
            origin: Origin::Agent,
            days: 7,
        };
        self.create_proposal(caller, draft).await
    }
}
