//! The one decision pipeline. Every subject the gateway runs code for (an execution, a session,
//! an execution in a session; the E2B calls map onto these) is decided the same way: its policy
//! input, the policy's decision, the isolation floor (`floor.rs`), then one verdict:
//! - denied: recorded (the execution row `denied`, or `session.denied`), nothing runs;
//! - held for review: recorded with its approval (`approvals.rs`), nothing runs until a reviewer
//!   of another principal approves it;
//! - admitted: the subject's own module commits the decision before anything runs
//!   (`executions.rs` queues and launches, `sessions.rs` starts the sandbox, `session_runs.rs`
//!   hands the turn over).
//!
//! What each subject is recorded as, and how a denial and a hold are committed for it, is
//! `subjects.rs`.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use policy_engine::{
    Decision, Environment, FileInput, PolicyInput, Principal, RequestInput, RequestKind,
    SessionParty,
};

use super::floor::Runnable;
use super::request::ExecutionRequest;
use super::sessions::SessionRequest;
use super::{App, AppError};
use crate::audit::sessions::SessionRow;
use crate::audit::ApiKey;

/// What is decided: a closed set. An E2B sandbox is a [`Subject::Session`], each of its
/// commands and cells a [`Subject::SessionExecution`].
#[derive(Debug)]
pub(super) enum Subject<'a> {
    /// A program run in a sandbox of its own (`POST /v1/executions`).
    Execution,
    /// A sandbox kept open across executions (`POST /v1/sessions`).
    Session(&'a SessionRequest),
    /// One execution in an open session: a turn of its resident runner.
    SessionExecution(InSession<'a>),
}

/// What deciding an execution in a session needs of the session.
#[derive(Debug)]
pub(super) struct InSession<'a> {
    pub(super) row: &'a SessionRow,
    /// Executions run in it so far (`request.session.executions`).
    pub(super) executions: u64,
    /// The key that opened it.
    pub(super) owner: SessionParty,
    /// What the session was allowed when it opened; a turn never gets more.
    pub(super) runnable: &'a Runnable,
    /// Through the E2B layer (`gateway/src/e2b`): the SDK call, for `request.e2b`.
    pub(super) e2b: Option<api_types::E2bInput>,
}

impl Subject<'_> {
    fn kind(&self) -> RequestKind {
        match self {
            Subject::Execution => RequestKind::Execution,
            Subject::Session(_) => RequestKind::Session,
            Subject::SessionExecution(_) => RequestKind::SessionExecution,
        }
    }

    /// Whether a decision that sends it to review holds it. A turn cannot wait for a reviewer
    /// (its session would stay busy meanwhile): it is refused instead.
    fn may_wait(&self) -> bool {
        !matches!(self, Subject::SessionExecution(_))
    }
}

/// One request to decide.
#[derive(Debug)]
pub(super) struct Ask<'a> {
    pub(super) caller: &'a ApiKey,
    pub(super) subject: Subject<'a>,
    /// What is asked, in an execution's terms (a session asks with no code).
    pub(super) request: &'a ExecutionRequest,
    /// The uploads, decoded and checked.
    pub(super) files: &'a [(String, Vec<u8>)],
    /// A session restored from this snapshot (a fork, DESIGN 15): the policy is told.
    pub(super) from_snapshot: Option<policy_engine::SnapshotInput>,
}

/// A subject decided and put to the floor; nothing recorded yet.
#[derive(Debug)]
pub(super) struct Decided {
    pub(super) input: PolicyInput,
    /// What the policy said: the audit event keeps it (replay compares against it).
    pub(super) said: Decision,
    /// What the gateway then did: the floor applied (limits clamped, or a refusal added).
    pub(super) decision: Decision,
    /// The decision's id (`dc_...`).
    pub(super) id: String,
    pub(super) revision: String,
    pub(super) verdict: Verdict,
}

/// The pipeline's answer for a subject.
#[derive(Debug, Clone)]
pub(super) enum Verdict {
    Denied,
    /// Sent to review, with what would run once approved.
    Held(Runnable),
    /// Allowed and under the floor: what runs.
    Admitted(Runnable),
}

impl Verdict {
    /// What runs (now or once approved); `None` when denied.
    pub(super) fn runnable(&self) -> Option<&Runnable> {
        match self {
            Verdict::Denied => None,
            Verdict::Held(runnable) | Verdict::Admitted(runnable) => Some(runnable),
        }
    }
}

/// What became of a subject, `R` being what it is recorded as (`subjects.rs`).
#[derive(Debug)]
pub(super) enum Outcome<R: Record> {
    /// Committed as denied: nothing runs.
    Denied(R),
    /// Committed with its approval: nothing runs until a reviewer approves.
    Held(R::Held),
    /// Not committed yet: the subject commits `R` before `Runnable` runs.
    Admitted(R, Runnable),
}

/// What a subject is recorded as, and how its denial and its hold are committed.
pub(super) trait Record: Sized {
    /// What a hold answers (the pending row, its approval).
    type Held;

    fn new(app: &App, ask: &Ask<'_>, decided: &Decided) -> Self;

    /// Commits the denial.
    async fn deny(&self, app: &App) -> Result<(), AppError>;

    /// Commits the hold: the pending row, its approval and their events, in one transaction.
    async fn hold(
        self,
        app: &Arc<App>,
        ask: &Ask<'_>,
        decided: &Decided,
        runnable: &Runnable,
    ) -> Result<Self::Held, AppError>;
}

impl App {
    /// decide -> floor -> deny / hold for review / admit.
    pub(super) async fn pipeline<R: Record>(
        self: &Arc<Self>,
        ask: &Ask<'_>,
    ) -> Result<Outcome<R>, AppError> {
        let decided = self.decide(ask)?;
        let record = R::new(self, ask, &decided);
        match &decided.verdict {
            Verdict::Denied => {
                record.deny(self).await?;
                Ok(Outcome::Denied(record))
            }
            Verdict::Held(runnable) => {
                let held = record.hold(self, ask, &decided, runnable).await?;
                Ok(Outcome::Held(held))
            }
            Verdict::Admitted(runnable) => Ok(Outcome::Admitted(record, runnable.clone())),
        }
    }

    /// The policy's decision for `ask` under the floor, and the verdict. An execution in a
    /// session of another key is `NotFound` unless the decision shares the session
    /// (`session_owner.rs`).
    pub(super) fn decide(&self, ask: &Ask<'_>) -> Result<Decided, AppError> {
        let mut input = self.policy_input(ask.caller, ask.request, ask.files);
        input.request.kind = ask.subject.kind();
        input.request.from_snapshot.clone_from(&ask.from_snapshot);
        if let Subject::SessionExecution(session) = &ask.subject {
            input.request.session = Some(Self::session_input(
                ask.caller,
                session.row,
                session.executions,
                session.owner.clone(),
            ));
        }
        // E2B layer (`gateway/src/e2b`): the template, `allow_internet_access` or the SDK call.
        input.request.e2b = match &ask.subject {
            Subject::Execution => None,
            Subject::Session(request) => request.e2b.clone(),
            Subject::SessionExecution(session) => session.e2b.clone(),
        };
        // One snapshot: the revision recorded is the one that decided.
        let policy = self.policy.current();
        let said = policy.state.decide(&input);
        if let Subject::SessionExecution(session) = &ask.subject {
            if session.row.key_id != ask.caller.id && !super::session_owner::shares(&said) {
                // Shared for this key in general, not for this execution: still not its session.
                return Err(AppError::NotFound);
            }
        }
        let mut decision = said.clone();
        let floor = self.enforce_floor(&ask.request.language, &mut decision);
        let floor = match &ask.subject {
            Subject::SessionExecution(session) => {
                floor.map(|r| turn_runnable(session.runnable, &r))
            }
            _ => floor,
        };
        let verdict = verdict(ask.subject.may_wait(), decision.require_approval, floor);
        Ok(Decided {
            input,
            said,
            decision,
            id: crate::ids::new("dc"),
            revision: policy.state.revision().to_owned(),
            verdict,
        })
    }

    /// The policy input for `request` by `caller`, as an execution (`decide` sets the kind and
    /// the session).
    pub(super) fn policy_input(
        &self,
        caller: &ApiKey,
        request: &ExecutionRequest,
        files: &[(String, Vec<u8>)],
    ) -> PolicyInput {
        PolicyInput {
            principal: Principal {
                key_id: caller.id.clone(),
                tenant: caller.tenant.clone(),
                role: caller.role.as_str().to_owned(),
            },
            request: RequestInput {
                language: request.language.clone(),
                code_sha256: hex::encode(Sha256::digest(request.code.as_bytes())),
                code_bytes: request.code.len() as u64,
                files: files
                    .iter()
                    .map(|(path, content)| FileInput {
                        path: path.clone(),
                        bytes: content.len() as u64,
                    })
                    .collect(),
                network: request.network.clone(),
                mounts: request.mounts.clone(),
                limits: request.limits.clone(),
                labels: request.labels.clone(),
                kind: RequestKind::Execution,
                session: None,
                from_snapshot: None,
                e2b: None,
            },
            environment: Environment {
                backends: self.config.backends.keys().cloned().collect(),
                datasets: self.config.datasets.keys().cloned().collect(),
                now: crate::ids::now_micros().to_rfc3339(),
            },
        }
    }
}

/// The verdict on a decision the floor made runnable (or not).
fn verdict(may_wait: bool, require_approval: bool, runnable: Option<Runnable>) -> Verdict {
    match runnable {
        None => Verdict::Denied,
        Some(runnable) if !require_approval => Verdict::Admitted(runnable),
        Some(runnable) if may_wait => Verdict::Held(runnable),
        Some(_) => Verdict::Denied,
    }
}

/// What a turn runs with: the session's sandbox and limits as decided when it opened; only the
/// deadline is this call's, and never longer than the session's.
fn turn_runnable(session: &Runnable, allowed: &Runnable) -> Runnable {
    let mut runnable = session.clone();
    runnable.limits.timeout_ms = allowed.limits.timeout_ms.min(session.limits.timeout_ms);
    runnable
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy_engine::Limits;

    fn runnable(timeout_ms: u64, memory_mb: u64) -> Runnable {
        Runnable {
            backend: "gvisor".into(),
            runtime: "runsc".into(),
            image: "python".into(),
            limits: Limits {
                timeout_ms,
                memory_mb,
                cpus: 1.0,
                pids: 256,
                disk_mb: 64,
                output_bytes: 1024,
            },
            mounts: Vec::new(),
            network: None,
        }
    }

    #[test]
    fn what_the_floor_refused_is_denied_whatever_review_says() {
        assert!(matches!(verdict(true, false, None), Verdict::Denied));
        assert!(matches!(verdict(true, true, None), Verdict::Denied));
        assert!(matches!(verdict(false, true, None), Verdict::Denied));
    }

    #[test]
    fn an_allowed_decision_runs_unless_sent_to_review() {
        let admitted = verdict(true, false, Some(runnable(1, 64)));
        assert!(matches!(admitted, Verdict::Admitted(_)));
        let held = verdict(true, true, Some(runnable(1, 64)));
        assert!(matches!(held, Verdict::Held(_)));
        assert!(held.runnable().is_some());
    }

    #[test]
    fn a_turn_sent_to_review_is_denied_not_held() {
        assert!(!Subject::SessionExecution(InSession {
            row: &session_row(),
            executions: 0,
            owner: SessionParty::default(),
            runnable: &runnable(1, 64),
            e2b: None,
        })
        .may_wait());
        assert!(matches!(
            verdict(false, true, Some(runnable(1, 64))),
            Verdict::Denied
        ));
        assert!(matches!(
            verdict(false, false, Some(runnable(1, 64))),
            Verdict::Admitted(_)
        ));
    }

    #[test]
    fn every_subject_is_decided_as_its_own_kind() {
        let request: SessionRequest =
            serde_json::from_value(serde_json::json!({"language": "python"})).unwrap();
        let session = Subject::Session(&request);
        assert_eq!(Subject::Execution.kind(), RequestKind::Execution);
        assert_eq!(session.kind(), RequestKind::Session);
        assert!(Subject::Execution.may_wait() && session.may_wait());
    }

    #[test]
    fn a_turn_keeps_the_sessions_limits_and_only_shortens_its_deadline() {
        let session = runnable(10_000, 512);
        let shorter = turn_runnable(&session, &runnable(2_000, 4096));
        assert_eq!(shorter.limits.timeout_ms, 2_000);
        assert_eq!(shorter.limits.memory_mb, 512);
        let longer = turn_runnable(&session, &runnable(60_000, 64));
        assert_eq!(longer.limits.timeout_ms, 10_000);
        assert_eq!(longer.limits.memory_mb, 512);
    }

    fn session_row() -> SessionRow {
        let now = crate::ids::now_micros();
        SessionRow {
            id: "ss_1".into(),
            tenant: "t".into(),
            key_id: "k".into(),
            language: "python".into(),
            status: crate::session_wire::SessionStatus::Ready,
            closed_reason: None,
            decision: sqlx::types::Json(serde_json::json!({})),
            limits: sqlx::types::Json(serde_json::json!({})),
            idle_timeout_s: 1,
            ttl_s: 1,
            executions: 0,
            instance: "i".into(),
            container: None,
            created_at: now,
            last_used_at: now,
            expires_at: now,
            closed_at: None,
            approval_id: None,
            start: None,
        }
    }
}
