//! A proposal's evidence says what that change, and only it, would do (issue 25, review of the
//! first build): the replay re-decides each recorded input on the base and on the candidate, so
//! a proposal made after another was approved is not blamed for its effects; each kind of change
//! falls in its bucket (review, limits, grants: inspection and credentials of a rule too) with
//! its examples' kind (a session opening is a session, not an execution); at most 20 examples;
//! an agent's request for a shipped tenant passes the shipped cases and can be approved; and
//! the builds agents can trigger are bounded. Real gateway, PostgreSQL, runsc.

use crate::common;
use crate::proposals::{gateway_on, policy_with_lab};

use serde_json::{json, Value};

use common::{copy_of_shipped, fresh_database, TestGateway};

async fn propose(gw: &TestGateway, key: &str, body: &Value) -> Value {
    let (status, proposal) = gw.post(key, "/v1/policy/proposals", body).await;
    assert_eq!(status, 201, "{proposal}");
    proposal
}

async fn approve(gw: &TestGateway, key: &str, proposal: &Value) -> Value {
    let id = proposal["id"].as_str().unwrap();
    let body = json!({"candidate_revision": proposal["candidate_revision"]});
    let path = format!("/v1/policy/proposals/{id}/approve");
    let (status, approved) = gw.post(key, &path, &body).await;
    assert_eq!(status, 200, "{approved}");
    approved
}

fn example(kind: &str, id: &str) -> Value {
    json!({"kind": kind, "id": id})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_proposal_is_not_blamed_for_one_approved_before_it() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let agent = gw.key("agent", "lab").await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    let mut denied = Vec::new();
    for _ in 0..21 {
        let (status, body) = gw.execute(&agent, "bash", "echo hi", json!({})).await;
        assert_eq!(status, 403, "{body}");
        denied.push(body["error"]["execution_id"].as_str().unwrap().to_owned());
    }

    // A: lab may run bash. Its 21 denials would now run; 20 of them are shown.
    let first = propose(&gw, &alice, &json!({"from_execution": denied[0]})).await;
    let opened = &first["evidence"]["replay"]["deny_to_allow"];
    assert_eq!(opened["count"], 21, "{opened}");
    let examples = opened["examples"].as_array().unwrap();
    assert_eq!(examples.len(), 20, "at most 20 examples: {opened}");
    assert!(examples
        .iter()
        .all(|e| e["kind"] == "execution" && denied.contains(&e["id"].as_str().unwrap().into())));
    approve(&gw, &bob, &first).await;

    // B, on A's revision, changes something else: the same denials are recorded as denials,
    // but B does not open them (A did). Comparing with the recorded decisions blamed B.
    let patch = json!({"data/tenants.yaml": {"tenants": {"lab": {"datasets": ["census"]}}}});
    let second = propose(
        &gw,
        &alice,
        &json!({"title": "lab reads census", "patch": patch}),
    )
    .await;
    let replay = &second["evidence"]["replay"];
    assert_eq!(second["base_revision"], first["candidate_revision"]);
    assert!(replay["total"].as_u64().unwrap() >= 21, "{replay}");
    assert_eq!(replay["deny_to_allow"]["count"], 0, "{replay}");
    assert_eq!(replay["unchanged"], replay["total"], "{replay}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_falls_in_its_bucket_with_the_kind_of_its_example() {
    let policy = copy_of_shipped();
    let gw = gateway_on(policy.path()).await;
    let agent = gw.key("agent", "acme").await;
    let reviewer = gw.key("reviewer", "ops").await;

    let pypi = json!({"network": [{"host": "pypi.org", "port": 443}]});
    let (status, allowed) = gw.execute(&agent, "python", "print(1)", pypi).await;
    assert_eq!(status, 200, "{allowed}");
    let allowed = allowed["id"].as_str().unwrap().to_owned();
    let unlisted = json!({"network": [{"host": "api.example.com", "port": 443}]});
    let (status, held) = gw.execute(&agent, "python", "print(1)", unlisted).await;
    assert_eq!(status, 202, "{held}");
    let held = held["id"].as_str().unwrap().to_owned();
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_owned();
    let (status, closed) = gw.delete(&agent, &format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200, "{closed}");

    // pypi.org now inspected with a credential, api.example.com listed, more memory.
    let acme = json!({
        "network": {"allow": [
            {"host": "pypi.org", "ports": [443], "inspect": true, "credentials": ["github"]},
            {"host": "files.pythonhosted.org", "ports": [443]},
            {"host": "api.example.com", "ports": [443]},
        ]},
        "limits": {"memory_mb": 640},
    });
    let patch = json!({"data/tenants.yaml": {"tenants": {"acme": acme}}});
    let proposal = propose(&gw, &reviewer, &json!({"title": "t", "patch": patch})).await;
    let replay = &proposal["evidence"]["replay"];
    let examples = |bucket: &str| replay[bucket]["examples"].as_array().unwrap().clone();
    assert_eq!(
        examples("review_changes"),
        [example("execution", &held)],
        "{replay}"
    );
    assert_eq!(
        examples("grant_changes"),
        [example("execution", &allowed)],
        "the credential and inspection given to an allowed host: {replay}"
    );
    let limits = examples("limit_changes");
    assert!(limits.contains(&example("execution", &allowed)), "{replay}");
    assert!(
        limits.contains(&example("session", &session)),
        "a session opening is a session: {replay}"
    );
    assert_eq!(replay["allow_to_deny"]["count"], 0, "{replay}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_request_for_a_shipped_tenant_passes_the_shipped_cases_and_is_approved() {
    let policy = copy_of_shipped();
    let gw = gateway_on(policy.path()).await;
    let agent = gw.key("agent", "classroom").await;
    let reviewer = gw.key("reviewer", "ops").await;
    let census = json!({"mounts": ["dataset:census"]});
    let (status, denied) = gw.execute(&agent, "python", "print(1)", census).await;
    assert_eq!(status, 403, "{denied}");
    let execution = denied["error"]["execution_id"].as_str().unwrap();
    let path = format!("/v1/executions/{execution}/access-request");
    let words = json!({"justification": "the exercise uses the census"});
    let (status, asked) = gw.post(&agent, &path, &words).await;
    assert_eq!(status, 201, "{asked}");
    // The agent learns which proposal it opened, not the patch (the reviewers' to read).
    let keys: Vec<&String> = asked.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["proposal_id", "status"], "{asked}");
    let id = asked["proposal_id"].as_str().unwrap();
    let (_, proposal) = gw
        .get(&reviewer, &format!("/v1/policy/proposals/{id}"))
        .await;
    assert_eq!(
        proposal["patch"],
        json!({"data/tenants.yaml": {"tenants": {"classroom": {"datasets": ["census"]}}}})
    );
    assert_eq!(
        proposal["tests_passed"], true,
        "the shipped cases must not pin what a suggestion changes: {}",
        proposal["evidence"]["tests"]
    );
    let approved = approve(&gw, &reviewer, &proposal).await;
    assert_eq!(approved["proposal"]["status"], "approved", "{approved}");
    gw.stop().await;
}

async fn metric(gw: &TestGateway, admin: &str, name: &str) -> u64 {
    let text = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|line| line.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line[name.len() + 1..].trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_access_requests_are_refused_past_the_bounds_and_builds_stay_bounded() {
    let policy = copy_of_shipped();
    let dir = policy.path().to_owned();
    let gw = TestGateway::start_with(Some(fresh_database().await), move |config| {
        config.policy_dir = dir;
        config.proposals.concurrent_builds = 1;
        config.proposals.access_requests_per_hour = 3;
    })
    .await;
    let agent = gw.key("agent", "classroom").await;
    let admin = gw.key("admin", "ops").await;
    let census = json!({"mounts": ["dataset:census"]});
    let (status, denied) = gw.execute(&agent, "python", "print(1)", census).await;
    assert_eq!(status, 403, "{denied}");
    let execution = denied["error"]["execution_id"].as_str().unwrap().to_owned();

    let path = format!("/v1/executions/{execution}/access-request");
    let asks = (0..12).map(|n| {
        let (gw, agent, path) = (&gw, &agent, &path);
        async move {
            let words = json!({"justification": format!("attempt {n}")});
            gw.post(agent, path, &words).await
        }
    });
    let answers = futures_util::future::join_all(asks).await;
    let created = answers.iter().filter(|(status, _)| *status == 201).count();
    let refused: Vec<&Value> = answers
        .iter()
        .filter(|(status, _)| *status == 429)
        .map(|(_, body)| body)
        .collect();
    assert_eq!(created + refused.len(), 12, "{answers:?}");
    assert!((1..=3).contains(&created), "{answers:?}");
    assert!(refused.iter().all(|body| {
        let message = body["error"]["message"].as_str().unwrap_or("");
        body["error"]["code"] == "rate_limited"
            && (message.contains("proposals.concurrent_builds")
                || message.contains("proposals.access_requests_per_hour"))
    }));
    let started = metric(&gw, &admin, "sandgate_proposal_builds_started_total").await;
    assert!(
        (1..=3).contains(&started),
        "{started} builds started for 12 requests"
    );
    assert_eq!(
        metric(&gw, &admin, "sandgate_proposal_builds_peak").await,
        1
    );

    // Later, one at a time: the hour's rate holds whatever is open.
    for _ in created..3 {
        let (status, body) = gw.post(&agent, &path, &json!({"justification": "j"})).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = gw.post(&agent, &path, &json!({"justification": "j"})).await;
    assert_eq!(status, 429, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 3 an hour"));
    gw.stop().await;
}
