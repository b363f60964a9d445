//! Policy proposals under races and bad input (issue 25, after review), through the real stack:
//! in-process gateways on a real PostgreSQL, two of them on one database where replicas matter.
//!
//! - An approval racing a rejection and a second approval: exactly one acts, and what the
//!   proposal says matches what is active (the claim comes before the apply).
//! - Two replicas approving two proposals of one base, and two replicas reloading with one
//!   `If-Match`: exactly one applies (the compare-and-swap holds at the database).
//! - An approval names the candidate it was shown; a rebase (audited) makes the old view stale.
//! - The policy directory is replaced whole, or left alone when it does not hold the base.
//! - Concurrent creations stop at the open-proposal bound; the replay is bounded and says so.
//! - A cited approval must exist and be the cited execution's; `If-Match` per RFC 9110; a
//!   suggested limit stops at the ceilings; a client that goes away leaves no half approval
//!   and no scratch directory.

use crate::common;
use crate::proposals::{events, gateway_on, policy_with_lab};

use std::path::Path;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use common::{copy_of_shipped, fresh_database, until, TestGateway};

fn new(patch: Value) -> Value {
    json!({"title": "t", "rationale": "r", "patch": patch})
}

fn lab(change: Value) -> Value {
    new(json!({"data/tenants.yaml": {"tenants": {"lab": change}}}))
}

fn approve_path(p: &Value) -> String {
    format!("/v1/policy/proposals/{}/approve", p["id"].as_str().unwrap())
}

fn reviewed(p: &Value) -> Value {
    json!({"candidate_revision": p["candidate_revision"]})
}

async fn active(gw: &TestGateway, admin: &str) -> String {
    let (status, policy) = gw.get(admin, "/v1/policy").await;
    assert_eq!(status, 200, "{policy}");
    policy["revision"].as_str().unwrap().to_owned()
}

async fn created(gw: &TestGateway, key: &str, body: &Value) -> Value {
    let (status, proposal) = gw.post(key, "/v1/policy/proposals", body).await;
    assert_eq!(status, 201, "{proposal}");
    proposal
}

/// Events of `kind` about proposal `id`.
async fn about(gw: &TestGateway, admin: &str, kind: &str, id: &str) -> Vec<Value> {
    let all = events(gw, admin, kind).await;
    all.into_iter()
        .filter(|e| e["input"]["proposal_id"] == id || e["input"]["proposal"] == id)
        .collect()
}

async fn reload_if_match(gw: &TestGateway, admin: &str, tag: &str, body: &Value) -> (u16, Value) {
    let response = gw
        .http
        .post(format!("{}/v1/policy/reload", gw.url))
        .bearer_auth(admin)
        .header("if-match", tag)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_racing_a_rejection_and_another_approval_acts_once() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let (alice, bob, carol) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    let admin = gw.key("admin", "ops").await;
    let proposal = created(&gw, &alice, &lab(json!({"languages": ["python", "ruby"]}))).await;
    let id = proposal["id"].as_str().unwrap();
    let base = proposal["base_revision"].as_str().unwrap();
    let path = approve_path(&proposal);
    let reject = format!("/v1/policy/proposals/{id}/reject");
    let body = reviewed(&proposal);
    let no = json!({"comment": "no"});
    let (first, second, rejected) = tokio::join!(
        gw.post(&bob, &path, &body),
        gw.post(&carol, &path, &body),
        async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            gw.post(&carol, &reject, &no).await
        },
    );
    let answers = [&first, &second, &rejected];
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{answers:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 409),
        "{answers:?}"
    );
    let (_, now) = gw.get(&admin, &format!("/v1/policy/proposals/{id}")).await;
    let applied = about(&gw, &admin, "policy.reload", id).await;
    let approvals = about(&gw, &admin, "policy.proposal.approved", id).await;
    let rejections = about(&gw, &admin, "policy.proposal.rejected", id).await;
    if now["status"] == "approved" {
        assert_eq!(active(&gw, &admin).await, proposal["candidate_revision"]);
        assert_eq!(
            (applied.len(), approvals.len(), rejections.len()),
            (1, 1, 0)
        );
    } else {
        assert_eq!(now["status"], "rejected", "{now}");
        assert_eq!(
            active(&gw, &admin).await,
            base,
            "a rejected proposal was applied"
        );
        assert_eq!(
            (applied.len(), approvals.len(), rejections.len()),
            (0, 0, 1)
        );
    }
    gw.stop().await;
}

/// Two gateways on one database and one policy directory (replicas, in-process).
async fn two_replicas(policy: &Path) -> (TestGateway, TestGateway) {
    let url = fresh_database().await;
    let start = |url: String| {
        let dir = policy.to_owned();
        TestGateway::start_with(Some(url), move |config| config.policy_dir = dir)
    };
    let a = start(url.clone()).await;
    let b = start(url).await;
    assert_ne!(a.instance().await, b.instance().await);
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_of_one_base_on_two_replicas_apply_once() {
    let policy = policy_with_lab();
    let (a, b) = two_replicas(policy.path()).await;
    let (alice, bob, carol) = (
        a.key("reviewer", "ops").await,
        a.key("reviewer", "ops").await,
        a.key("reviewer", "ops").await,
    );
    let admin = a.key("admin", "ops").await;
    let first = created(&a, &alice, &lab(json!({"languages": ["python", "ruby"]}))).await;
    let second = created(&b, &alice, &lab(json!({"datasets": ["census"]}))).await;
    assert_eq!(first["base_revision"], second["base_revision"]);
    let (path_a, body_a) = (approve_path(&first), reviewed(&first));
    let (path_b, body_b) = (approve_path(&second), reviewed(&second));
    let (on_a, on_b) = tokio::join!(
        a.post(&bob, &path_a, &body_a),
        b.post(&carol, &path_b, &body_b),
    );
    let answers = [&on_a, &on_b];
    let won: Vec<usize> = (0..2).filter(|i| answers[*i].0 == 200).collect();
    assert_eq!(won.len(), 1, "both or neither applied: {answers:?}");
    let lost = answers[1 - won[0]];
    assert_eq!(lost.0, 409, "{lost:?}");
    assert_eq!(lost.1["error"]["code"], "revision_conflict", "{lost:?}");
    let winner = [&first, &second][won[0]];
    let wanted = winner["candidate_revision"].as_str().unwrap().to_owned();
    for gw in [&a, &b] {
        until(
            Duration::from_secs(30),
            "both replicas run the winner",
            || async { (active(gw, &admin).await == wanted).then_some(()) },
        )
        .await;
    }
    let on_disk = policy_engine::PolicyEngine::load(policy.path()).unwrap();
    assert_eq!(on_disk.revision(), wanted);
    let (_, loser) = a
        .get(
            &admin,
            &format!(
                "/v1/policy/proposals/{}",
                [&first, &second][1 - won[0]]["id"].as_str().unwrap()
            ),
        )
        .await;
    assert_eq!(loser["status"], "open", "{loser}");
    a.stop().await;
    b.stop().await;
}

/// A copy of the shipped bundle that reads as another revision (a comment added).
fn variant(note: &str) -> tempfile::TempDir {
    let dir = copy_of_shipped();
    let tenants = dir.path().join("data/tenants.yaml");
    let mut text = std::fs::read_to_string(&tenants).unwrap();
    text.push_str(&format!("\n# {note}\n"));
    std::fs::write(&tenants, text).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_with_one_if_match_on_two_replicas_apply_once() {
    let policy = copy_of_shipped();
    let (a, b) = two_replicas(policy.path()).await;
    let admin = a.key("admin", "ops").await;
    let base = active(&a, &admin).await;
    let (one, two) = (variant("one"), variant("two"));
    let tag = format!("\"{base}\"");
    let (body_a, body_b) = (json!({"dir": one.path()}), json!({"dir": two.path()}));
    let (on_a, on_b) = tokio::join!(
        reload_if_match(&a, &admin, &tag, &body_a),
        reload_if_match(&b, &admin, &tag, &body_b),
    );
    let answers = [&on_a, &on_b];
    assert_eq!(
        answers.iter().filter(|(status, _)| *status == 200).count(),
        1,
        "{answers:?}"
    );
    let lost = answers.iter().find(|(status, _)| *status != 200).unwrap();
    assert_eq!(lost.0, 409, "{lost:?}");
    assert_eq!(lost.1["error"]["code"], "revision_conflict", "{lost:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_names_the_candidate_it_was_shown_and_a_rebase_is_audited() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    let admin = gw.key("admin", "ops").await;
    let first = created(&gw, &alice, &lab(json!({"languages": ["python", "ruby"]}))).await;
    let second = created(&gw, &alice, &lab(json!({"datasets": ["census"]}))).await;

    let (status, unnamed) = gw.post(&bob, &approve_path(&second), &json!({})).await;
    assert_eq!(
        status, 400,
        "an approval that names no candidate: {unnamed}"
    );
    let other = json!({"candidate_revision": format!("sha256:{}", "0".repeat(64))});
    let (status, wrong) = gw.post(&bob, &approve_path(&second), &other).await;
    assert_eq!(status, 409, "{wrong}");
    assert_eq!(wrong["error"]["code"], "conflict", "{wrong}");

    let (status, done) = gw
        .post(&bob, &approve_path(&first), &reviewed(&first))
        .await;
    assert_eq!(status, 200, "{done}");
    let id = second["id"].as_str().unwrap();
    let rebase = format!("/v1/policy/proposals/{id}/rebase");
    let (status, rebased) = gw.post(&alice, &rebase, &json!({})).await;
    assert_eq!(status, 200, "{rebased}");
    assert_ne!(rebased["candidate_revision"], second["candidate_revision"]);
    let (status, stale) = gw
        .post(&bob, &approve_path(&second), &reviewed(&second))
        .await;
    assert_eq!(
        status, 409,
        "the view before the rebase was approved: {stale}"
    );
    assert_eq!(stale["error"]["code"], "conflict", "{stale}");
    let rebases = about(&gw, &admin, "policy.proposal.rebased", id).await;
    assert_eq!(rebases.len(), 1, "{rebases:?}");
    assert_eq!(
        rebases[0]["decision"]["previous_candidate"],
        second["candidate_revision"]
    );
    assert_eq!(
        rebases[0]["decision"]["candidate_revision"],
        rebased["candidate_revision"]
    );
    assert_eq!(
        rebases[0]["input"]["base_revision"],
        done["applied"]["revision"]
    );
    let (status, applied) = gw
        .post(&bob, &approve_path(&second), &reviewed(&rebased))
        .await;
    assert_eq!(status, 200, "{applied}");
    gw.stop().await;
}

/// Entries of `dir`'s parent named like a staging copy of it.
fn staging_left(dir: &Path) -> Vec<String> {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|entry| entry.starts_with(&format!(".{name}.sandgate-")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_directory_is_replaced_whole_or_left_alone() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    // Applied on a clean directory: it reads as the candidate, its extra files kept.
    let first = created(&gw, &alice, &lab(json!({"languages": ["python", "ruby"]}))).await;
    let (status, done) = gw
        .post(&bob, &approve_path(&first), &reviewed(&first))
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["applied"]["policy_dir_written"], true, "{done}");
    let engine = policy_engine::PolicyEngine::load(policy.path()).unwrap();
    assert_eq!(engine.revision(), first["candidate_revision"]);
    assert!(policy.path().join("README.md").is_file());
    assert_eq!(staging_left(policy.path()), Vec::<String>::new());

    // Edited by hand since: the approved revision is active, the directory is left as it is
    // (never the hand edit mixed with the proposal's data).
    let second = created(&gw, &alice, &lab(json!({"datasets": ["census"]}))).await;
    let rego = policy.path().join("execution.rego");
    let mut text = std::fs::read_to_string(&rego).unwrap();
    text.push_str("\n# edited by hand\n");
    std::fs::write(&rego, &text).unwrap();
    let tenants = std::fs::read_to_string(policy.path().join("data/tenants.yaml")).unwrap();
    let (status, done) = gw
        .post(&bob, &approve_path(&second), &reviewed(&second))
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["applied"]["policy_dir_written"], false, "{done}");
    let why = done["applied"]["policy_dir_error"].as_str().unwrap();
    assert!(why.contains("does not hold the proposal's base"), "{why}");
    assert_eq!(std::fs::read_to_string(&rego).unwrap(), text);
    assert_eq!(
        std::fs::read_to_string(policy.path().join("data/tenants.yaml")).unwrap(),
        tenants
    );
    assert_eq!(staging_left(policy.path()), Vec::<String>::new());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_stop_at_the_open_proposal_bound() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await; // 4 open per key
    let reviewer = gw.key("reviewer", "ops").await;
    let body = lab(json!({"languages": ["python", "ruby"]}));
    let answers =
        join_all((0..10).map(|_| gw.post(&reviewer, "/v1/policy/proposals", &body))).await;
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        4,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 429),
        "{statuses:?}"
    );
    let (_, open) = gw.get(&reviewer, "/v1/policy/proposals?status=open").await;
    assert_eq!(open["proposals"].as_array().unwrap().len(), 4);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_reads_a_bounded_number_of_decisions_and_says_when_it_was_cut() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let agent = gw.key("agent", "lab").await;
    let reviewer = gw.key("reviewer", "ops").await;
    for _ in 0..3 {
        let (status, denied) = gw.execute(&agent, "bash", "echo hi", json!({})).await;
        assert_eq!(status, 403, "{denied}");
    }
    let mut body = lab(json!({"languages": ["python", "bash"]}));
    body["replay_limit"] = json!(2);
    let cut = created(&gw, &reviewer, &body).await;
    let replay = &cut["evidence"]["replay"];
    assert_eq!(replay["limit"], 2, "{replay}");
    assert_eq!(replay["truncated"], true, "{replay}");
    assert_eq!(replay["total"], 2, "{replay}");
    assert_eq!(replay["deny_to_allow"]["count"], 2, "{replay}");
    let whole = created(
        &gw,
        &reviewer,
        &lab(json!({"languages": ["python", "bash"]})),
    )
    .await;
    let replay = &whole["evidence"]["replay"];
    assert_eq!(replay["limit"], 20_000, "{replay}");
    assert_eq!(replay["truncated"], false, "{replay}");
    assert_eq!(replay["deny_to_allow"]["count"], 3, "{replay}");
    body["replay_limit"] = json!(20_001);
    let (status, refused) = gw.post(&reviewer, "/v1/policy/proposals", &body).await;
    assert_eq!(status, 400, "{refused}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cited_approval_must_exist_and_be_the_cited_executions() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let acme = gw.key("agent", "acme").await;
    let lab_agent = gw.key("agent", "lab").await;
    let reviewer = gw.key("reviewer", "ops").await;
    let network = json!({"network": [{"host": "review.example", "port": 443}]});
    let (status, held) = gw.execute(&acme, "bash", "echo hi", network).await;
    assert_eq!(status, 202, "{held}");
    let (held_id, approval) = (
        held["id"].as_str().unwrap().to_owned(),
        held["approval_id"].as_str().unwrap().to_owned(),
    );
    let (status, denied) = gw.execute(&lab_agent, "bash", "echo hi", json!({})).await;
    assert_eq!(status, 403, "{denied}");
    let denied_id = denied["error"]["execution_id"].as_str().unwrap();

    let mut missing = lab(json!({"languages": ["python", "ruby"]}));
    missing["source_approval"] = json!("ap_no_such_approval");
    let (status, refused) = gw.post(&reviewer, "/v1/policy/proposals", &missing).await;
    assert_eq!(status, 400, "{refused}");
    let other = json!({"from_execution": denied_id, "source_approval": approval});
    let (status, refused) = gw.post(&reviewer, "/v1/policy/proposals", &other).await;
    assert_eq!(status, 400, "an approval of another execution: {refused}");
    let same = json!({"from_execution": held_id, "source_approval": approval});
    let proposal = created(&gw, &reviewer, &same).await;
    assert_eq!(proposal["source_approval"], approval.as_str());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_match_takes_a_star_a_list_and_never_a_weak_tag() {
    let policy = copy_of_shipped();
    let gw = gateway_on(policy.path()).await;
    let admin = gw.key("admin", "ops").await;
    let revision = active(&gw, &admin).await;
    let (status, any) = reload_if_match(&gw, &admin, "*", &json!({})).await;
    assert_eq!(status, 200, "{any}");
    let weak = format!("W/\"{revision}\"");
    let (status, refused) = reload_if_match(&gw, &admin, &weak, &json!({})).await;
    assert_eq!(status, 409, "a weak tag matched: {refused}");
    assert_eq!(refused["error"]["code"], "revision_conflict");
    let list = format!("\"sha256:{}\", \"{revision}\"", "0".repeat(64));
    let (status, listed) = reload_if_match(&gw, &admin, &list, &json!({})).await;
    assert_eq!(status, 200, "{listed}");
    let (status, odd) = reload_if_match(&gw, &admin, "\"latest\"", &json!({})).await;
    assert_eq!(status, 400, "{odd}");
    // GET /v1/policy gives the revision as its entity tag, to send back.
    let shown = gw
        .http
        .get(format!("{}/v1/policy", gw.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let etag = shown.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, format!("\"{revision}\""));
    let (status, tagged) = reload_if_match(&gw, &admin, &etag, &json!({})).await;
    assert_eq!(status, 200, "{tagged}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suggested_limit_raise_stops_at_the_gateway_ceilings() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let agent = gw.key("agent", "lab").await;
    let reviewer = gw.key("reviewer", "ops").await;
    let asked = json!({"limits": {"timeout_ms": 999_999_999u64}});
    let (status, ran) = gw.execute(&agent, "python", "print(1)", asked).await;
    assert_eq!(status, 200, "{ran}");
    let body = json!({"from_execution": ran["id"]});
    let proposal = created(&gw, &reviewer, &body).await;
    let ceiling = gateway::config::Ceilings::default().timeout_ms;
    assert_eq!(
        proposal["patch"],
        json!({"data/tenants.yaml": {"tenants": {"lab": {"limits": {"timeout_ms": ceiling}}}}})
    );
    gw.stop().await;
}

/// Entries of the gateway's scratch directory (`<data_dir>/policy-incoming/`).
fn scratch_entries(gw: &TestGateway) -> usize {
    let incoming = gw.data_dir.path().join("policy-incoming");
    std::fs::read_dir(incoming).map_or(0, |entries| entries.count())
}

/// POSTs `body` to `path` and goes away (the connection closed) once the gateway is at work on
/// it: while it builds a candidate in its scratch directory.
async fn post_and_go_away(gw: &TestGateway, key: &str, path: &str, body: &Value) {
    let request = gw
        .http
        .post(format!("{}{path}", gw.url))
        .bearer_auth(key)
        .json(body)
        .send();
    let request = tokio::spawn(request);
    until(
        Duration::from_secs(30),
        "the gateway builds a candidate",
        || async { (scratch_entries(gw) > 0).then_some(()) },
    )
    .await;
    request.abort();
    let gone = request.await;
    assert!(
        gone.is_err(),
        "it answered before the client went away: {gone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_leaves_no_half_approval_and_no_scratch_directory() {
    let policy = policy_with_lab();
    let gw = gateway_on(policy.path()).await;
    let (alice, bob) = (
        gw.key("reviewer", "ops").await,
        gw.key("reviewer", "ops").await,
    );
    let admin = gw.key("admin", "ops").await;
    let proposal = created(&gw, &alice, &lab(json!({"languages": ["python", "ruby"]}))).await;
    let id = proposal["id"].as_str().unwrap();
    post_and_go_away(&gw, &bob, &approve_path(&proposal), &reviewed(&proposal)).await;
    until(Duration::from_secs(30), "the approval finishes", || async {
        let (_, now) = gw.get(&admin, &format!("/v1/policy/proposals/{id}")).await;
        (now["status"] == "approved").then_some(())
    })
    .await;
    assert_eq!(active(&gw, &admin).await, proposal["candidate_revision"]);
    assert_eq!(about(&gw, &admin, "policy.reload", id).await.len(), 1);
    until(
        Duration::from_secs(30),
        "no scratch directory is left",
        || async { (scratch_entries(&gw) == 0).then_some(()) },
    )
    .await;

    let body = lab(json!({"datasets": ["census"]}));
    post_and_go_away(&gw, &alice, "/v1/policy/proposals", &body).await;
    until(
        Duration::from_secs(30),
        "no scratch directory is left",
        || async { (scratch_entries(&gw) == 0).then_some(()) },
    )
    .await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_left_by_an_abrupt_stop_are_removed_at_start_up() {
    let policy = copy_of_shipped();
    let data = tempfile::tempdir().unwrap();
    let scratch = data.path().join("policy-incoming/proposal-left");
    std::fs::create_dir_all(scratch.join("data")).unwrap();
    std::fs::write(scratch.join("data/tenants.yaml"), "tenants: {}\n").unwrap();
    let name = policy.path().file_name().unwrap().to_string_lossy();
    let staging = policy
        .path()
        .parent()
        .unwrap()
        .join(format!(".{name}.sandgate-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(staging.join("data")).unwrap();
    let url = fresh_database().await;
    let dir = policy.path().to_owned();
    let gw = TestGateway::start_in(Some(url), data, move |config| config.policy_dir = dir).await;
    assert!(!scratch.exists(), "a scratch copy survived the start");
    assert!(!staging.exists(), "a staging copy survived the start");
    assert!(policy.path().join("data/tenants.yaml").is_file());
    gw.stop().await;
}
