//! Golden cases of the review, held-session, session and snapshot events (see the parent
//! module for what a golden case proves).

use serde_json::json;

use super::{at, same};
use crate::role::Role;

#[test]
fn approval_and_held_session_events_are_written_as_before() {
    use super::super::approvals::{
        ExecutionWithdrawal, Expiry, Party, Requester, Reviewed, Reviewer, SelfReview,
        SessionWithdrawal, Status, Verdict,
    };
    use super::super::sessions::{Denial, Denied, HeldClosed, HeldSession};
    use api_types::{ApprovalStatus, ClosedReason, ReviewDecision};

    let session = Some("se_1".to_owned());
    for (decision, old) in [
        (ReviewDecision::Approve, "approve"),
        (ReviewDecision::Reject, "reject"),
    ] {
        same(
            &SelfReview {
                approval_id: "ap_1".into(),
                session_id: session.clone(),
                decision,
                reviewer: Party {
                    key_id: "key_1".into(),
                    principal: "ana".into(),
                },
            },
            json!({
                "approval_id": "ap_1",
                "session_id": session,
                "decision": old,
                "reviewer": {"key_id": "key_1", "principal": "ana"},
            }),
        );
    }
    for status in ApprovalStatus::ALL {
        same(&Status { status: *status }, json!({"status": status}));
    }
    same(
        &Status {
            status: ApprovalStatus::Withdrawn,
        },
        json!({"status": "withdrawn"}),
    );
    let comment: Option<&str> = Some("fine");
    let (requester_key, requester_principal): (Option<String>, Option<String>) =
        (Some("key_2".into()), None);
    same(
        &Reviewed {
            approval_id: "ap_1".into(),
            session_id: None,
            reviewer: Reviewer {
                key_id: "key_1".into(),
                principal: "ana".into(),
                role: Role::Reviewer,
            },
            requested_by: Requester {
                key_id: requester_key.clone(),
                principal: requester_principal.clone(),
            },
            comment: comment.map(str::to_owned),
        },
        json!({
            "approval_id": "ap_1",
            "session_id": null,
            "reviewer": {"key_id": "key_1", "principal": "ana", "role": Role::Reviewer},
            "requested_by": {
                "key_id": requester_key,
                "principal": requester_principal,
            },
            "comment": comment,
        }),
    );
    let runnable = json!({"backend": "gvisor", "limits": {"memory_mb": 256}, "network": null});
    for (approve, stored) in [(true, Some(runnable.clone())), (false, None)] {
        let old_runnable = stored.clone().map(sqlx::types::Json);
        let verb = if approve { "approved" } else { "rejected" };
        same(
            &Verdict {
                status: if approve {
                    ApprovalStatus::Approved
                } else {
                    ApprovalStatus::Rejected
                },
                runnable: stored,
            },
            json!({"status": verb, "runnable": old_runnable}),
        );
    }
    same(
        &Expiry {
            approval_id: "ap_1".into(),
            session_id: None,
            expires_at: at(),
        },
        json!({"approval_id": "ap_1", "session_id": null, "expires_at": at()}),
    );
    let key_id = Some("key_1".to_owned());
    same(
        &ExecutionWithdrawal {
            approval_id: "ap_1".into(),
            requested_by: key_id.clone(),
        },
        json!({"approval_id": "ap_1", "requested_by": key_id}),
    );
    same(
        &SessionWithdrawal {
            approval_id: "ap_1".into(),
            session_id: "se_1".into(),
            requested_by: key_id.clone(),
        },
        json!({"approval_id": "ap_1", "session_id": "se_1", "requested_by": key_id}),
    );
    same(
        &Denial {
            session_id: "se_1".into(),
            approval_id: "ap_1".into(),
            reviewer: Party {
                key_id: "key_1".into(),
                principal: "ana".into(),
            },
        },
        json!({
            "session_id": "se_1",
            "approval_id": "ap_1",
            "reviewer": {"key_id": "key_1", "principal": "ana"},
        }),
    );
    same(
        &Denied {
            status: ApprovalStatus::Rejected,
            closed_reason: ClosedReason::Denied,
        },
        json!({"status": "rejected", "closed_reason": "denied"}),
    );
    same(
        &HeldSession {
            session_id: "se_1".into(),
            approval_id: Some("ap_1".into()),
        },
        json!({"session_id": "se_1", "approval_id": "ap_1"}),
    );
    for reason in [
        Some(ClosedReason::Expired),
        Some(ClosedReason::Deleted),
        None,
    ] {
        same(
            &HeldClosed {
                closed_reason: reason,
                executions: 0,
                created_at: at(),
            },
            json!({"closed_reason": reason, "executions": 0i64, "created_at": at()}),
        );
    }
}

/// A policy input and decision as the pipeline makes them (read from the form events carry).
fn policy_input() -> policy_engine::PolicyInput {
    serde_json::from_value(json!({
        "environment": {"backends": ["gvisor"], "datasets": [], "now": "2026-12-03T19:31:23+00:00"},
        "principal": {"key_id": "key_1", "role": "agent", "tenant": "acme"},
        "request": {"code_bytes": 0, "code_sha256": "e3", "files": [], "kind": "session",
                    "labels": {}, "language": "python", "limits": {}, "mounts": [],
                    "network": [{"host": "review.example", "port": 443}]},
    }))
    .unwrap()
}

fn policy_decision() -> policy_engine::Decision {
    serde_json::from_value(json!({
        "allow": true, "require_approval": true, "backend": "gvisor", "mounts": [],
        "network": null, "limits": null,
        "reasons": [{"code": "network.review_required", "message": "not listed"}],
    }))
    .unwrap()
}

#[test]
fn session_and_snapshot_events_are_written_as_before() {
    use super::super::approvals::Party;
    use super::super::sessions::{
        ApprovedOpen, Corrupt, CorruptUse, HeldClosed, Opened, Paused, Resumed, SessionRef,
    };
    use super::super::snapshots::{Snapshot, SnapshotOf};
    use api_types::ClosedReason;

    let id = "ss_1".to_owned();
    same(
        &SessionRef {
            session_id: id.clone(),
        },
        json!({"session_id": id}),
    );
    let input = policy_input();
    same(
        &Opened {
            session_id: id.clone(),
            request: input.clone(),
        },
        json!({"session_id": id, "request": input}),
    );
    let (reviewer_id, principal) = ("key_2".to_owned(), "bob".to_owned());
    same(
        &ApprovedOpen {
            session_id: id.clone(),
            approval_id: "ap_1".into(),
            reviewer: Party {
                key_id: reviewer_id.clone(),
                principal: principal.clone(),
            },
            from_snapshot: None,
        },
        json!({
            "session_id": id,
            "approval_id": "ap_1",
            "reviewer": {"key_id": reviewer_id, "principal": principal},
        }),
    );
    // An open session's `session.closed` (`app::sessions`).
    let (reason, executions, created_at) = (Some(ClosedReason::Idle), 3i64, at());
    same(
        &HeldClosed {
            closed_reason: reason,
            executions,
            created_at,
        },
        json!({
            "closed_reason": reason,
            "executions": executions,
            "created_at": created_at,
        }),
    );
    let (bytes, sha256, took_ms): (u64, String, u128) = (52_428_800, "ab".into(), 812);
    same(
        &Paused {
            bytes,
            sha256: sha256.clone(),
            took_ms,
        },
        json!({"bytes": bytes, "sha256": sha256, "took_ms": took_ms}),
    );
    let (restore_ms, check_ms): (u128, u128) = (640, 95);
    let (instance, from) = ("gw_b".to_owned(), "gw_a".to_owned());
    same(
        &Resumed {
            sha256: sha256.clone(),
            bytes,
            restore_ms,
            check_ms,
            replica: instance.clone(),
            paused_on: from.clone(),
        },
        json!({"sha256": sha256, "bytes": bytes,
            "restore_ms": restore_ms, "check_ms": check_ms,
            "replica": instance, "paused_on": from}),
    );
    same(
        &Corrupt {
            sha256: sha256.clone(),
            refused: CorruptUse::Restore,
        },
        json!({"sha256": sha256, "refused": "restore"}),
    );
    let (snapshot_id, size) = ("sn_1".to_owned(), 1_024i64);
    same(
        &SnapshotOf {
            session_id: id.clone(),
            snapshot_id: snapshot_id.clone(),
        },
        json!({"session_id": id, "snapshot_id": snapshot_id}),
    );
    for why in [None, Some("deleted by key_1")] {
        same(
            &Snapshot {
                bytes: size,
                sha256: sha256.clone(),
                created_at: at(),
                expires_at: at(),
                reason: why.map(str::to_owned),
            },
            json!({
                "bytes": size,
                "sha256": sha256,
                "created_at": at(),
                "expires_at": at(),
                "reason": why,
            }),
        );
    }
    same(&super::super::session_files::NoDecision {}, json!({}));
}

#[test]
fn approval_requests_are_written_as_before() {
    use super::super::approvals::{
        ExecutionRequested, Party, Pending, SessionPending, SessionRequested,
    };
    use api_types::ApprovalStatus;

    let (approval, key, principal) = ("ap_1".to_owned(), "key_1".to_owned(), "team-a".to_owned());
    let party = Party {
        key_id: key.clone(),
        principal: principal.clone(),
    };
    same(
        &ExecutionRequested {
            approval_id: approval.as_str().into(),
            requested_by: party.clone(),
        },
        json!({
            "approval_id": approval,
            "requested_by": {"key_id": key, "principal": principal},
        }),
    );
    let expires_at = at();
    same(
        &Pending {
            status: ApprovalStatus::Pending,
            expires_at,
        },
        json!({"status": "pending", "expires_at": expires_at}),
    );
    let (session, input) = ("ss_1".to_owned(), policy_input());
    same(
        &SessionRequested {
            approval_id: approval.as_str().into(),
            session_id: session.clone(),
            requested_by: party,
            request: input.clone(),
        },
        json!({
            "approval_id": approval,
            "session_id": session,
            "requested_by": {"key_id": key, "principal": principal},
            "request": input,
        }),
    );
    let said = policy_decision();
    same(
        &SessionPending {
            status: ApprovalStatus::Pending,
            expires_at,
            require_approval: true,
            policy: said.clone(),
        },
        json!({
            "status": "pending",
            "expires_at": expires_at,
            "require_approval": true,
            "policy": json!(said),
        }),
    );
}

#[test]
fn a_withdrawal_by_key_revocation_is_written_as_before() {
    use super::super::approvals::{KeyWithdrawal, Status, WithdrawnVia};
    use api_types::ApprovalStatus;

    let session_id = Some("ss_1".to_owned());
    for (by, via) in [
        (Some(()), WithdrawnVia::KeyRevokedApi),
        (None, WithdrawnVia::KeyRevokedCommandLine),
    ] {
        same(
            &KeyWithdrawal {
                approval_id: "ap_1".into(),
                session_id: session_id.clone(),
                requested_by: "key_1".into(),
                via,
            },
            json!({
                "approval_id": "ap_1",
                "session_id": session_id,
                "requested_by": "key_1",
                "via": if by.is_some() { "key_revoked_api" } else { "key_revoked_command_line" },
            }),
        );
    }
    same(
        &Status {
            status: ApprovalStatus::Withdrawn,
        },
        json!({"status": "withdrawn"}),
    );
}
