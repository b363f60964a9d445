//! `sandgate audit export` / `audit verify --bundle` through the real binary and a real
//! PostgreSQL: executions allowed, denied and approved, exported and checked offline (no
//! database), in sandgate's rows and in OCSF; a byte changed anywhere is found and named; a
//! tenant-filtered slice verifies with the other tenants' events as links only.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};

use common::TestGateway;

fn sandgate(gw: &TestGateway, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .env("SANDGATE_DATABASE_URL", gw.database_url.as_deref().unwrap())
        .env("SANDGATE_DATA_DIR", gw.data_dir.path())
        .output()
        .unwrap()
}

/// `audit verify --bundle` with no database configured at all: (success, stdout + stderr).
fn verify_offline(bundle: &Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["audit", "verify", "--bundle"])
        .arg(bundle)
        .env_remove("SANDGATE_DATABASE_URL")
        .env("SANDGATE_DATA_DIR", "/nonexistent/sandgate-no-data-dir")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn export(gw: &TestGateway, out: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "audit",
        "export",
        "--since",
        "1h",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let output = sandgate(gw, &args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn records(bundle: &Path) -> Vec<Value> {
    std::fs::read_to_string(bundle)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A copy of `bundle` with the first `from` in the first line containing `anchor` replaced by
/// `to` (of the same length).
fn change_bytes(bundle: &Path, anchor: &str, from: &str, to: &str) -> std::path::PathBuf {
    assert_eq!(from.len(), to.len());
    let text = std::fs::read_to_string(bundle).unwrap();
    let mut done = false;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if done || !line.contains(anchor) {
                return line.to_owned();
            }
            done = true;
            assert!(line.contains(from), "{from} not in {line}");
            line.replacen(from, to, 1)
        })
        .collect();
    assert!(done, "{anchor} not in the bundle");
    let changed = bundle.with_extension("changed");
    std::fs::write(&changed, lines.join("\n") + "\n").unwrap();
    changed
}

/// An allowed run, a denial, a second tenant's denial, and a request held for review that
/// another principal approves and that then runs.
async fn some_history(gw: &TestGateway) {
    let agent = gw.key_of("agent", "acme", "alice").await;
    let reviewer = gw.key_of("reviewer", "acme", "bob").await;
    let other = gw.key_of("agent", "globex", "carol").await;
    let (status, body) = gw.execute(&agent, "bash", "echo hi", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw.execute(&agent, "cobol", "x", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = gw.execute(&other, "cobol", "y", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let held = json!({"network": [{"host": "review.example", "port": 443}], "wait": false});
    let (status, body) = gw.execute(&agent, "bash", "echo reviewed", held).await;
    assert_eq!(status, 202, "{body}");
    let (id, approval) = (body["id"].clone(), body["approval_id"].clone());
    let path = format!("/v1/approvals/{}", approval.as_str().unwrap());
    let (status, body) = gw
        .post(&reviewer, &path, &json!({"decision": "approve"}))
        .await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..600 {
        let (_, record) = gw
            .get(&agent, &format!("/v1/executions/{}", id.as_str().unwrap()))
            .await;
        if !record["finished_at"].is_null() {
            assert_eq!(record["status"], "succeeded", "{record}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the approved execution did not finish");
}

#[tokio::test(flavor = "multi_thread")]
async fn export_verifies_offline_and_a_changed_byte_is_named() {
    common::require_docker();
    let policies = common::copy_of_shipped();
    let policy_dir = policies.path().to_owned();
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url), move |config| config.policy_dir = policy_dir).await;
    some_history(&gw).await;
    // A reload: the new revision's files are stored too, and a decision names it.
    let rego = policies.path().join("execution.rego");
    let text = std::fs::read_to_string(&rego).unwrap();
    std::fs::write(
        &rego,
        format!("{text}\n# reviewed for the audit export test\n"),
    )
    .unwrap();
    let admin = gw.key_of("admin", "ops", "dana").await;
    let (status, body) = gw.post(&admin, "/v1/policy/reload", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let agent = gw.key_of("agent", "acme", "erin").await;
    let (status, body) = gw.execute(&agent, "cobol", "z", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("audit.jsonl");
    let said = export(&gw, &bundle, &[]);
    assert!(said.contains("chain at export: ok"), "{said}");

    let lines = records(&bundle);
    assert_eq!(lines[0]["bundle"], "header", "{}", lines[0]);
    let proof = lines.last().unwrap();
    assert_eq!(proof["bundle"], "proof", "{proof}");
    let events: Vec<&Value> = lines.iter().filter(|l| l["bundle"] == "event").collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"]["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "execution.decision",
        "approval.requested",
        "approval.approved",
    ] {
        assert!(kinds.contains(&kind), "{kind} not exported: {kinds:?}");
    }
    assert!(
        events.iter().any(|e| e["event"]["allow"] == false),
        "no denial exported"
    );
    assert_eq!(proof["events"], events.len(), "{proof}");
    assert_eq!(proof["omitted"], 0, "{proof}");
    // The slice links to what came before it, and the policy's files are in the bundle.
    let first = &events[0]["event"];
    assert_eq!(proof["first"]["prev_hash"], first["prev_hash"]);
    let revisions: Vec<&Value> = lines
        .iter()
        .filter(|l| l["bundle"] == "policy_revision")
        .collect();
    assert_eq!(revisions.len(), 2, "{revisions:?}");
    for revision in &revisions {
        let files = revision["files"].as_array().unwrap();
        let rego = files
            .iter()
            .filter(|f| f["path"].as_str().unwrap().ends_with(".rego"));
        assert!(rego.count() >= 2, "{revision}");
    }

    let (ok, said) = verify_offline(&bundle);
    assert!(ok, "{said}");
    assert!(said.starts_with("ok events "), "{said}");
    assert!(said.contains("2 policy revisions recomputed"), "{said}");
    println!("intact: {said}");

    // One byte of the denied request (cobol -> cobxl): that event no longer matches its hash.
    let changed = change_bytes(&bundle, "\"cobol\"", "cobol", "cobxl");
    let (ok, said) = verify_offline(&changed);
    assert!(!ok, "a changed event verified: {said}");
    println!("a changed event: {said}");
    assert!(
        said.contains("does not match its hash (modified)"),
        "{said}"
    );
    assert!(said.contains("line "), "{said}");

    // One byte of a policy file: the revision no longer hashes to its name.
    let changed = change_bytes(
        &bundle,
        "\"bundle\":\"policy_revision\"",
        "package",
        "packagf",
    );
    let (ok, said) = verify_offline(&changed);
    assert!(!ok, "a changed policy file verified: {said}");
    assert!(said.contains("its files hash to"), "{said}");

    // One byte of the header (which no event hash covers): the proof's digest catches it.
    let changed = change_bytes(
        &bundle,
        "\"bundle\":\"header\"",
        "\"exported_at\":\"20",
        "\"exported_at\":\"21",
    );
    let (ok, said) = verify_offline(&changed);
    assert!(!ok, "a changed header verified: {said}");
    assert!(said.contains("digest does not match"), "{said}");

    // A truncated bundle: no proof.
    let text = std::fs::read_to_string(&bundle).unwrap();
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, &text[..text.rfind("{\"bundle\":\"proof\"").unwrap()]).unwrap();
    let (ok, said) = verify_offline(&cut);
    assert!(!ok && said.contains("ends before its proof"), "{said}");

    // An event removed from the middle: the next one does not link.
    let without: Vec<&str> = text
        .lines()
        .filter(|line| !line.contains("\"kind\":\"approval.requested\""))
        .collect();
    let gap = dir.path().join("gap.jsonl");
    std::fs::write(&gap, without.join("\n") + "\n").unwrap();
    let (ok, said) = verify_offline(&gap);
    assert!(!ok && said.contains("events are missing"), "{said}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_slice_and_ocsf_verify_offline() {
    common::require_docker();
    let gw = TestGateway::start().await;
    some_history(&gw).await;
    let dir = tempfile::tempdir().unwrap();

    // Only acme's events carry content; globex's denial is a link.
    let bundle = dir.path().join("acme.jsonl");
    export(&gw, &bundle, &["--tenant", "acme"]);
    let lines = records(&bundle);
    let omitted = lines.iter().filter(|l| l["bundle"] == "omitted").count();
    assert!(omitted >= 1, "globex's events were not omitted");
    for line in lines.iter().filter(|l| l["bundle"] == "event") {
        assert_eq!(line["event"]["tenant"], "acme", "{line}");
    }
    assert!(!std::fs::read_to_string(&bundle).unwrap().contains("globex"));
    let (ok, said) = verify_offline(&bundle);
    assert!(ok, "{said}");
    assert!(said.contains("filtered to tenant acme"), "{said}");

    // OCSF: every event is a record of a documented class, and the bundle still verifies.
    let bundle = dir.path().join("audit.ocsf.jsonl");
    export(&gw, &bundle, &["--format", "ocsf"]);
    let lines = records(&bundle);
    let ocsf: Vec<&Value> = lines
        .iter()
        .filter(|l| l["bundle"] == "ocsf_event")
        .map(|l| &l["ocsf"])
        .collect();
    assert!(!ocsf.is_empty());
    for record in &ocsf {
        let class = record["class_uid"].as_u64().unwrap();
        assert!(
            [1007, 4001, 4002, 3001, 3002, 6003].contains(&class),
            "{record}"
        );
        let activity = record["activity_id"].as_u64().unwrap();
        assert_eq!(
            record["type_uid"].as_u64().unwrap(),
            class * 100 + activity,
            "{record}"
        );
        assert_eq!(record["metadata"]["version"], "1.3.0", "{record}");
        assert!(record["time"].as_i64().unwrap() > 0, "{record}");
    }
    let class_of = |kind: &str| {
        ocsf.iter()
            .find(|r| r["unmapped"]["sandgate"]["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))["class_uid"]
            .clone()
    };
    assert_eq!(class_of("execution.decision"), 1007);
    assert_eq!(class_of("approval.requested"), 6003);
    assert_eq!(class_of("approval.approved"), 6003);
    let denied = ocsf
        .iter()
        .find(|r| r["class_uid"] == 1007 && r["unmapped"]["sandgate"]["allow"] == false)
        .unwrap();
    assert_eq!(denied["action_id"], 2, "{denied}");
    assert_eq!(denied["disposition_id"], 2, "{denied}");
    let (ok, said) = verify_offline(&bundle);
    assert!(ok, "{said}");

    // A mapped field changed (Denied -> Allowed): it no longer follows from its row.
    let changed = change_bytes(
        &bundle,
        "\"action\":\"Denied\"",
        "\"action_id\":2",
        "\"action_id\":1",
    );
    let (ok, said) = verify_offline(&changed);
    assert!(!ok, "{said}");
    assert!(
        said.contains("the OCSF fields differ from the row"),
        "{said}"
    );
    gw.stop().await;
}
