//! Golden: each typed payload serialises to the bytes of the `json!` it replaced (the literal
//! below is copied from the code before the change), so the chain hashes a new event exactly
//! as it hashed the same event before, and events written before the change read back into the
//! same structs.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use super::execution::{Cancel, Cancelled, Closed, Reaped};
use super::keys::{KeyCreate, KeyCreated, KeyRevoke, KeyRevoked, KeyRotate, KeyRotated, Via};
use super::{column, no_reasons, reason};
use crate::audit::chain::{canonical, Row};
use crate::role::Role;
use crate::status::ExecutionStatus;

fn at() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-03T09:30:00.123456Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// The bytes the chain hashes for a row carrying these payload columns (every hash scheme hashes
/// `chain::canonical`, so equal bytes mean equal links).
fn hash(reasons: &Value, input: &Value, decision: &Value) -> Vec<u8> {
    let at = at();
    let row = Row {
        seq: 7,
        id: "ev_1",
        at: &at,
        kind: api_types::EventKind::KeyCreate.as_str(),
        execution_id: None,
        key_id: Some("key_1"),
        tenant: Some("ops"),
        decision_id: None,
        allow: Some(true),
        reasons,
        input,
        decision,
        policy_revision: None,
    };
    canonical(&row)
}

/// `typed` serialises to exactly the bytes of `old`, is hashed over the same bytes, and `old`
/// reads back into `typed`.
fn same<T>(typed: &T, old: Value)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let new = column(typed);
    assert_eq!(new.to_string(), old.to_string());
    let none = json!([]);
    assert_eq!(hash(&none, &new, &none), hash(&none, &old, &none));
    let back: T = serde_json::from_value(old).unwrap();
    assert_eq!(&back, typed);
}

#[test]
fn reasons_are_written_as_before() {
    assert_eq!(no_reasons().to_string(), json!([]).to_string());
    let why = "closed by gw-b: owner gw-a lease expired";
    assert_eq!(
        reason("lease.expired", why).to_string(),
        json!([{"code": "lease.expired", "message": why}]).to_string()
    );
}

#[test]
fn key_events_are_written_as_before() {
    let expires_at = Some(at());
    for (by, via) in [(Some(()), Via::Api), (None, Via::CommandLine)] {
        let old_via = if by.is_some() { "api" } else { "command_line" };
        same(
            &KeyCreate {
                role: Role::Reviewer,
                tenant: "acme".into(),
                principal: "ana ruiz".into(),
                expires_at,
                via,
            },
            json!({
                "role": "reviewer",
                "tenant": "acme",
                "principal": "ana ruiz",
                "expires_at": expires_at,
                "via": old_via,
            }),
        );
    }
    same(
        &KeyCreate {
            role: Role::Agent,
            tenant: "acme".into(),
            principal: "key_1".into(),
            expires_at: None,
            via: Via::CommandLine,
        },
        json!({"role": "agent", "tenant": "acme", "principal": "key_1", "expires_at": null,
               "via": "command_line"}),
    );
    same(
        &KeyCreated {
            created_key_id: "key_2".into(),
        },
        json!({"created_key_id": "key_2"}),
    );
    same(
        &KeyRevoke {
            key_id: "key_2".into(),
            role: Role::Admin,
            tenant: "ops".into(),
            via: Via::Api,
        },
        json!({"key_id": "key_2", "role": "admin", "tenant": "ops", "via": "api"}),
    );
    same(
        &KeyRevoked {
            revoked_key_id: "key_2".into(),
        },
        json!({"revoked_key_id": "key_2"}),
    );
    same(
        &KeyRotate {
            key_id: "key_2".into(),
            role: Role::Auditor,
            tenant: "audit".into(),
            principal: "soc".into(),
            expires_at: None,
            via: Via::CommandLine,
        },
        json!({"key_id": "key_2", "role": "auditor", "tenant": "audit",
               "principal": "soc", "expires_at": null, "via": "command_line"}),
    );
    same(
        &KeyRotated {
            revoked_key_id: "key_2".into(),
            created_key_id: "key_3".into(),
        },
        json!({"revoked_key_id": "key_2", "created_key_id": "key_3"}),
    );
}

#[test]
fn execution_events_are_written_as_before() {
    same(
        &Cancel {
            requested_by: "key_1".into(),
            requested_by_tenant: "acme".into(),
        },
        json!({"requested_by": "key_1", "requested_by_tenant": "acme"}),
    );
    same(&Cancelled { cancel: true }, json!({"cancel": true}));
    same(
        &Reaped::Abandoned {
            instance: "gw-a".into(),
        },
        json!({"instance": "gw-a"}),
    );
    same(
        &Reaped::LeaseExpired {
            owner: "gw-a".into(),
            closed_by: "gw-b".into(),
        },
        json!({"owner": "gw-a", "closed_by": "gw-b"}),
    );
    same(
        &Closed {
            status: ExecutionStatus::Error,
        },
        json!({"status": "error"}),
    );
}

#[test]
fn a_renamed_or_skipped_field_would_change_the_hash() {
    // The check above is not vacuous: a payload that differs by one key hashes differently.
    let none = json!([]);
    let old = json!({"requested_by": "key_1", "requested_by_tenant": "acme"});
    let renamed = json!({"requested_by": "key_1", "tenant": "acme"});
    assert_ne!(hash(&none, &old, &none), hash(&none, &renamed, &none));
    let skipped = json!({"role": "agent", "tenant": "acme", "principal": "key_1",
                         "via": "command_line"});
    let with_null = column(&KeyCreate {
        role: Role::Agent,
        tenant: "acme".into(),
        principal: "key_1".into(),
        expires_at: None,
        via: Via::CommandLine,
    });
    assert_ne!(hash(&none, &with_null, &none), hash(&none, &skipped, &none));
}

#[test]
fn egress_events_are_written_as_before() {
    use super::egress::{
        Connection, ConnectionVerdict, DeniedCount, DeniedWindow, Misdirected, Request,
        RequestVerdict, Verdict,
    };
    let policy_reasons = json!([{"code": "host.allowed", "message": "in the grant"}]);
    for session_id in [None, Some("ss_1".to_owned())] {
        // The old code inserted `session_id` only when there was one.
        let with_session = |mut old: Value| {
            if let (Some(session), Some(fields)) = (&session_id, old.as_object_mut()) {
                fields.insert("session_id".to_owned(), json!(session));
            }
            old
        };
        same(
            &Connection {
                host: "pypi.org".into(),
                port: 443,
                scheme: "https".into(),
                sni: Some("pypi.org".into()),
                method: None,
                path: None,
                resolved_addr: Some("151.101.0.223:443".into()),
                session_id: session_id.clone(),
            },
            with_session(json!({
                "host": "pypi.org", "port": 443, "scheme": "https", "sni": "pypi.org",
                "method": null, "path": null, "resolved_addr": "151.101.0.223:443",
            })),
        );
        same(
            &Request {
                connection_id: "eg_1".into(),
                host: "api.example.com".into(),
                port: 443,
                method: "POST".into(),
                path: "/v1/x".into(),
                query_sha256: None,
                headers: vec!["authorization".into(), "content-type".into()],
                upgrade: false,
                upgrade_protocol: None,
                session_id: session_id.clone(),
            },
            with_session(json!({
                "connection_id": "eg_1", "host": "api.example.com", "port": 443,
                "method": "POST", "path": "/v1/x", "query_sha256": null,
                "headers": ["authorization", "content-type"], "upgrade": false,
            })),
        );
        same(
            &Misdirected {
                connection_id: "eg_1".into(),
                host: "evil.example".into(),
                session_id: session_id.clone(),
            },
            with_session(json!({"connection_id": "eg_1", "host": "evil.example"})),
        );
        same(
            &DeniedWindow {
                from: Some(at()),
                until: None,
                session_id: session_id.clone(),
            },
            with_session(json!({"from": Some(at()), "until": None::<DateTime<Utc>>})),
        );
    }
    same(
        &ConnectionVerdict {
            allow: true,
            policy_reasons: policy_reasons.clone(),
        },
        json!({"allow": true, "policy_reasons": policy_reasons}),
    );
    same(
        &RequestVerdict {
            allow: false,
            credentials: vec!["github".into()],
            policy_reasons: policy_reasons.clone(),
        },
        json!({"allow": false, "credentials": ["github"], "policy_reasons": policy_reasons}),
    );
    same(&Verdict { allow: false }, json!({"allow": false}));
    let by_reason = [
        ("host.denied".to_owned(), 3u64),
        ("port.denied".to_owned(), 1),
    ];
    same(
        &DeniedCount {
            allow: false,
            count: 4,
            by_reason: by_reason.iter().cloned().collect(),
        },
        json!({
            "allow": false,
            "count": 4u64,
            "by_reason": by_reason.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        }),
    );
}

/// A chain written by the gateway before its events were typed (`sandgate keys create|rotate|
/// revoke` on the command line, then `POST /v1/keys`, a denied execution, a malformed key and
/// `DELETE /v1/keys/{id}` over the API; exported with `sandgate audit export`).
const BEFORE: &str = include_str!("../../../../tests/fixtures/chain_before_typed_events.jsonl");
/// Each stored event of a typed kind reads into its structs, which write the same columns and
/// so the same hashed bytes; and every link of the chain (scheme 1, written before scheme 2
/// existed) still recomputes. The fixture is a version-1 bundle, which `verify --bundle` no
/// longer reads, so its events are checked link by link with the one hash definition.
#[test]
fn a_chain_written_before_the_change_verifies_and_reads_into_the_types() {
    use crate::audit::bundle::Record;
    use crate::audit::chain::{hash, HashScheme};

    fn event_of(line: &str) -> Option<Record> {
        let mut value: Value = serde_json::from_str(line).unwrap();
        if value["bundle"] != "event" {
            return None;
        }
        value["event"]["hash_version"] = json!(1);
        Some(serde_json::from_value(value).unwrap())
    }
    fn again<T: Serialize + DeserializeOwned>(stored: &Value) -> Value {
        column(&serde_json::from_value::<T>(stored.clone()).unwrap())
    }
    let mut linked = 0;
    let mut prev: Option<String> = None;
    for line in BEFORE.lines() {
        let Some(Record::Event { event }) = event_of(line) else {
            continue;
        };
        if let Some(prev) = &prev {
            assert_eq!(
                &event.prev_hash, prev,
                "event {} links to the one before",
                event.seq
            );
        }
        assert_eq!(
            hash(HashScheme::Whole, &event.prev_hash, &event.row()),
            event.hash
        );
        prev = Some(event.hash.clone());
        linked += 1;
    }
    assert_eq!(linked, 9, "events 1..9 of the fixture");
    let mut typed = 0;
    for line in BEFORE.lines() {
        let Some(Record::Event { event }) = event_of(line) else {
            continue;
        };
        let (input, decision) = match event.kind.as_str() {
            "key.create" => (
                again::<KeyCreate>(&event.input),
                again::<KeyCreated>(&event.decision),
            ),
            "key.revoke" => (
                again::<KeyRevoke>(&event.input),
                again::<KeyRevoked>(&event.decision),
            ),
            "key.rotate" => (
                again::<KeyRotate>(&event.input),
                again::<KeyRotated>(&event.decision),
            ),
            "auth.failure" => (
                again::<super::refusals::Refused>(&event.input),
                again::<super::egress::Verdict>(&event.decision),
            ),
            _ => continue,
        };
        let mut rewritten = event.clone();
        rewritten.input = input;
        rewritten.decision = decision;
        assert_eq!(rewritten, event);
        assert_eq!(
            canonical(&rewritten.row()),
            canonical(&event.row()),
            "{}",
            event.kind
        );
        typed += 1;
    }
    assert_eq!(
        typed, 8,
        "4 key.create, 2 key.revoke, 1 key.rotate, 1 auth.failure"
    );
}

#[test]
fn policy_events_are_written_as_before() {
    use super::policy::{EntryPoint, Evaluate, Reload, Reloaded};
    use policy_engine::Reason;
    for (accepted, previous) in [(Some("sha256:bb"), "sha256:aa"), (None, "sha256:aa")] {
        same(
            &Reloaded {
                accepted: accepted.is_some(),
                revision: accepted.map(str::to_owned),
                previous: previous.to_owned(),
            },
            json!({"accepted": accepted.is_some(), "revision": accepted, "previous": previous}),
        );
    }
    let dir = std::path::Path::new("/etc/sandgate/policies");
    same(
        &Reload {
            source: "upload".into(),
            policy_dir: dir.display().to_string(),
            loaded_by: "key_1".into(),
        },
        json!({"source": "upload", "policy_dir": dir.display().to_string(), "loaded_by": "key_1"}),
    );
    let input = json!({"request": {"language": "python"}, "principal": {"tenant": "acme"}});
    for entry_point in [EntryPoint::Execution, EntryPoint::Egress] {
        let old_entry = match entry_point {
            EntryPoint::Execution => "execution",
            EntryPoint::Egress => "egress",
        };
        same(
            &Evaluate {
                entry_point,
                input: input.clone(),
            },
            json!({"entry_point": old_entry, "input": input}),
        );
    }
    let reasons = vec![Reason {
        code: "policy.rejected".into(),
        message: "no execution.rego".into(),
    }];
    assert_eq!(column(&reasons), json!(reasons));
}

#[test]
fn refusal_and_retention_events_are_written_as_before() {
    use super::egress::Verdict;
    use super::refusals::{Refused, RefusedRepeatedly, Repeats};
    use super::retention::{Purge, Purged};
    let request = json!({"method": "GET", "path": "/v1/executions"});
    for (source, claimed) in [(Some("127.0.0.1"), Some("key_1")), (None, None)] {
        same(
            &Refused {
                source: source.map(str::to_owned),
                claimed_key_id: claimed.map(str::to_owned),
                request: request.clone(),
            },
            json!({"source": source, "claimed_key_id": claimed, "request": request}),
        );
        same(
            &RefusedRepeatedly {
                source: source.map(str::to_owned),
                claimed_key_id: claimed.map(str::to_owned),
                window_start: at(),
                window_end: at(),
                last: request.clone(),
            },
            json!({
                "source": source,
                "claimed_key_id": claimed,
                "window_start": at(),
                "window_end": at(),
                "last": request,
            }),
        );
    }
    same(&Verdict { allow: false }, json!({"allow": false}));
    same(
        &Repeats {
            allow: false,
            repeats: 12,
            throttled: 3,
        },
        json!({"allow": false, "repeats": 12u64, "throttled": 3u64}),
    );
    let ids = vec!["ex_1".to_owned(), "ex_2".to_owned()];
    same(
        &Purge {
            retention_days: 30,
            finished_before: at(),
            executions: ids.clone(),
        },
        json!({"retention_days": 30u32, "finished_before": at(), "executions": ids}),
    );
    same(
        &Purged {
            purged: ["stdout", "stderr", "outputs"].map(str::to_owned).to_vec(),
        },
        json!({"purged": ["stdout", "stderr", "outputs"]}),
    );
}

#[test]
fn proposal_events_are_written_as_before() {
    use super::proposals::{Approved, Proposal, Proposed, Rebased, Rejected, ReplayCounts};
    use api_types::{ProposalOrigin, ProposalStatus};

    let patch =
        json!({"data/tenants.yaml": {"tenants": {"lab": {"languages": ["python", "bash"]}}}});
    for (origin, old_origin, source) in [
        (ProposalOrigin::Agent, "agent", Some("ex_1".to_owned())),
        (ProposalOrigin::Reviewer, "reviewer", None),
    ] {
        same(
            &Proposal {
                proposal_id: "pp_1".into(),
                title: "Allow bash".into(),
                origin,
                author_key_id: "key_1".into(),
                source_execution: source.clone(),
                source_approval: None,
                base_revision: "sha256:aa".into(),
                patch: patch.clone(),
            },
            // `"origin": row.origin` was the stored text.
            json!({
                "proposal_id": "pp_1",
                "title": "Allow bash",
                "origin": old_origin,
                "author_key_id": "key_1",
                "source_execution": source,
                "source_approval": null,
                "base_revision": "sha256:aa",
                "patch": patch,
            }),
        );
    }
    // What `replay_evidence` stores: counts with their examples.
    let replay = json!({
        "days": 7, "total": 12, "unchanged": 10, "truncated": false, "limit": 20000,
        "allow_to_deny": {"count": 0, "examples": []},
        "deny_to_allow": {"count": 1, "examples": ["ex_1"]},
        "review_changes": {"count": 1, "examples": ["ex_2"]},
        "limit_changes": {"count": 0, "examples": []},
    });
    // The summary the event carried before.
    let count = |name: &str| replay[name]["count"].clone();
    let old_summary = json!({
        "days": replay["days"],
        "total": replay["total"],
        "allow_to_deny": count("allow_to_deny"),
        "deny_to_allow": count("deny_to_allow"),
        "review_changes": count("review_changes"),
        "limit_changes": count("limit_changes"),
    });
    assert_eq!(
        column(&ReplayCounts::of(&replay)).to_string(),
        old_summary.to_string()
    );
    assert_eq!(
        column(&ReplayCounts::of(&json!({}))).to_string(),
        json!({"days": null, "total": null, "allow_to_deny": null, "deny_to_allow": null,
               "review_changes": null, "limit_changes": null})
        .to_string()
    );
    same(
        &Proposed {
            status: ProposalStatus::Open,
            candidate_revision: "sha256:bb".into(),
            tests_passed: true,
            replay: ReplayCounts::of(&replay),
        },
        json!({
            "status": "open",
            "candidate_revision": "sha256:bb",
            "tests_passed": true,
            "replay": old_summary,
        }),
    );
    same(
        &Rebased {
            status: ProposalStatus::Open,
            previous_base: "sha256:aa".into(),
            previous_candidate: "sha256:bb".into(),
            candidate_revision: "sha256:cc".into(),
            tests_passed: false,
            replay: ReplayCounts::of(&replay),
        },
        json!({
            "status": "open",
            "previous_base": "sha256:aa",
            "previous_candidate": "sha256:bb",
            "candidate_revision": "sha256:cc",
            "tests_passed": false,
            "replay": old_summary,
        }),
    );
    for comment in [Some("lab shell ok".to_owned()), None] {
        same(
            &Approved {
                status: ProposalStatus::Approved,
                revision: "sha256:bb".into(),
                previous: "sha256:aa".into(),
                comment: comment.clone(),
            },
            json!({
                "status": "approved",
                "revision": "sha256:bb",
                "previous": "sha256:aa",
                "comment": comment,
            }),
        );
    }
    same(
        &Rejected {
            status: ProposalStatus::Rejected,
            comment: "too broad".into(),
        },
        json!({"status": "rejected", "comment": "too broad"}),
    );
}

mod reviews_and_sessions;
