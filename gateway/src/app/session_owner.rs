//! Whose a session is (issue 21, item 4): the key that opened it. Another agent key of its
//! tenant finds it only when the policy shares it explicitly: the decision for an execution of
//! that key in that session (`request.kind` `session_execution`, with `request.session.owner`
//! and `request.session.asked_by`) allows and carries the reason code `session.shared`. Without
//! that, every session route answers as for a missing id (404): get, list, delete, executions in
//! it (here, or relayed to the replica holding it, which checks again) and the records and event
//! streams of executions run in it. Reviewers, auditors and admins read sessions as before; they
//! run nothing in them.

use std::collections::HashMap;

use policy_engine::{
    Decision, PolicyInput, RequestKind, SessionInput, SessionParty, SESSION_SHARED_CODE,
};

use super::request::ExecutionRequest;
use super::{App, AppError};
use crate::audit::sessions::SessionRow;
use crate::audit::ApiKey;

/// Whether a decision shares a session with a key that did not open it.
pub(super) fn shares(decision: &Decision) -> bool {
    decision.allow
        && decision
            .reasons
            .iter()
            .any(|reason| reason.code == SESSION_SHARED_CODE)
}

impl App {
    /// `Ok` when `caller` (an agent of the session's tenant) may see and use `row`: it opened
    /// it, or the policy shares it; `NotFound` otherwise.
    pub(super) async fn check_session_owner(
        &self,
        caller: &ApiKey,
        row: &SessionRow,
    ) -> Result<(), AppError> {
        if row.key_id == caller.id {
            return Ok(());
        }
        let owner = self.session_party(&row.key_id).await?;
        if shares(&self.decide_session_access(caller, row, owner)) {
            return Ok(());
        }
        tracing::info!(session_id = %row.id, key_id = %caller.id, "a session of another key was asked for");
        Err(AppError::NotFound)
    }

    /// `rows` without the sessions `caller` may not see (an agent sees its own and those the
    /// policy shares with it).
    pub(super) async fn visible_sessions(
        &self,
        caller: &ApiKey,
        rows: Vec<SessionRow>,
    ) -> Result<Vec<SessionRow>, AppError> {
        let mut owners: HashMap<String, SessionParty> = HashMap::new();
        let mut visible = Vec::with_capacity(rows.len());
        for row in rows {
            if row.key_id != caller.id {
                if !owners.contains_key(&row.key_id) {
                    let owner = self.session_party(&row.key_id).await?;
                    owners.insert(row.key_id.clone(), owner);
                }
                let owner = owners.get(&row.key_id).cloned().unwrap_or_default();
                if !shares(&self.decide_session_access(caller, &row, owner)) {
                    continue;
                }
            }
            visible.push(row);
        }
        Ok(visible)
    }

    /// The key `key_id` and its principal (the key id itself when the key is gone).
    pub(super) async fn session_party(&self, key_id: &str) -> Result<SessionParty, AppError> {
        let principal = self.audit.key_principal(key_id).await?;
        Ok(SessionParty {
            key_id: key_id.to_owned(),
            principal: principal.unwrap_or_else(|| key_id.to_owned()),
        })
    }

    /// `request.session` of a decision in session `row` for `caller`.
    pub(super) fn session_input(
        caller: &ApiKey,
        row: &SessionRow,
        executions: u64,
        owner: SessionParty,
    ) -> SessionInput {
        SessionInput {
            id: row.id.clone(),
            executions,
            created_at: row.created_at.to_rfc3339(),
            owner,
            asked_by: SessionParty {
                key_id: caller.id.clone(),
                principal: caller.principal.clone(),
            },
        }
    }

    /// The decision for an execution of `caller` in `row` that runs nothing yet (no code, no
    /// files): what sharing a session for reading or closing it is decided on.
    fn decide_session_access(
        &self,
        caller: &ApiKey,
        row: &SessionRow,
        owner: SessionParty,
    ) -> Decision {
        let nothing = ExecutionRequest {
            language: row.language.clone(),
            code: String::new(),
            files: Vec::new(),
            network: Vec::new(),
            mounts: Vec::new(),
            limits: Default::default(),
            labels: Default::default(),
            wait: true,
        };
        let mut input: PolicyInput = self.policy_input(caller, &nothing, &[]);
        input.request.kind = RequestKind::SessionExecution;
        let executions = u64::try_from(row.executions).unwrap_or(0);
        input.request.session = Some(Self::session_input(caller, row, executions, owner));
        self.policy.current().state.decide(&input)
    }
}
