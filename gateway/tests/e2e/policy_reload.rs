//! Reloading a candidate bundle from another directory, keeping the last N revisions and
//! rolling back (issue 16 item 10), through the HTTP API and the command line: each accepted
//! or refused reload is a `policy.reload` event; a refused one leaves the active bundle.
//! Also `sandgate policy eval`'s revision and `--fail-on-deny`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

use crate::common;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use common::{copy_of_shipped, TestGateway};

/// A copy of the shipped bundle whose revision differs (a comment added), decisions unchanged.
fn variant(note: &str) -> tempfile::TempDir {
    let dir = copy_of_shipped();
    let rego = dir.path().join("execution.rego");
    let mut text = std::fs::read_to_string(&rego).unwrap();
    text.push_str(&format!("\n# {note}\n"));
    std::fs::write(&rego, text).unwrap();
    dir
}

async fn revision(gw: &TestGateway, admin: &str) -> (String, Vec<String>) {
    let (status, policy) = gw.get(admin, "/v1/policy").await;
    assert_eq!(status, 200, "{policy}");
    let kept = policy["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["revision"].as_str().unwrap().to_owned())
        .collect();
    (policy["revision"].as_str().unwrap().to_owned(), kept)
}

fn sandgate(gw: &TestGateway, key: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .env("SANDGATE_URL", &gw.url)
        .env("SANDGATE_KEY", key)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_directory_is_reloaded_kept_and_rolled_back() {
    let shipped = copy_of_shipped();
    let policy_dir = shipped.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
        config.policy_keep = 2;
    })
    .await;
    let admin = gw.key("admin", "ops").await;
    let (first, kept) = revision(&gw, &admin).await;
    assert_eq!(kept, vec![first.clone()], "the start-up bundle is kept");

    // A candidate from another directory.
    let second_dir = variant("second");
    let (status, answer) = gw
        .post(
            &admin,
            "/v1/policy/reload",
            &json!({"dir": second_dir.path()}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let second = answer["revision"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    assert_eq!(answer["previous"], first.as_str());

    // Refused: a relative path, a missing one, a bundle that does not compile. It stays.
    let broken = variant("broken");
    std::fs::write(
        broken.path().join("execution.rego"),
        "package sandgate.execution\nnot rego(",
    )
    .unwrap();
    for body in [
        json!({"dir": "policies"}),
        json!({"dir": "/nonexistent/policies"}),
        json!({"dir": broken.path()}),
        json!({"dir": 7}),
    ] {
        let (status, answer) = gw.post(&admin, "/v1/policy/reload", &body).await;
        assert!(status == 409 || status == 400, "{body}: {status} {answer}");
        assert_eq!(revision(&gw, &admin).await.0, second, "{body}");
    }

    // Through the command line: a third revision; only two are kept.
    let third_dir = variant("third");
    let out = sandgate(
        &gw,
        &admin,
        &[
            "policy",
            "reload",
            "--dir",
            third_dir.path().to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let (third, kept) = revision(&gw, &admin).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("accepted revision {third}")),
        "{out:?}"
    );
    assert_eq!(
        kept,
        vec![third.clone(), second.clone()],
        "keep 2, newest first"
    );

    // Roll back to the one before, then by name; an unkept one is refused.
    let out = sandgate(&gw, &admin, &["policy", "rollback"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(revision(&gw, &admin).await.0, second);
    let (status, answer) = gw
        .post(&admin, "/v1/policy/rollback", &json!({"revision": third}))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(revision(&gw, &admin).await.0, third);
    let out = sandgate(&gw, &admin, &["policy", "rollback", &first]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not kept"),
        "{out:?}"
    );
    // Not for other roles.
    let reviewer = gw.key("reviewer", "ops").await;
    let (status, _) = gw.post(&reviewer, "/v1/policy/rollback", &json!({})).await;
    assert_eq!(status, 403);

    // Every attempt is on record, with its source.
    let pool = gw.pool().await;
    let events: Vec<(bool, Value)> = sqlx::query_as(
        "SELECT allow, input FROM audit_events WHERE kind = 'policy.reload' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    let sources: Vec<(bool, &str)> = events
        .iter()
        .map(|(allow, input)| (*allow, input["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        sources,
        vec![
            (true, "dir"),
            (false, "dir"),
            (false, "dir"),
            (false, "dir"),
            (true, "dir"),
            (true, "rollback"),
            (true, "rollback"),
            (false, "rollback"),
        ],
        "{events:?}"
    );
    gw.stop().await;
}

#[test]
fn policy_eval_prints_the_revision_and_fails_on_deny_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let input = |tenant: &str| {
        json!({
            "principal": {"key_id": "k", "tenant": tenant, "role": "agent"},
            "request": {"kind": "execution", "language": "python", "code_sha256": "00",
                        "code_bytes": 1, "files": [], "network": [], "mounts": [],
                        "limits": {}, "labels": {}},
            "environment": {"backends": ["gvisor"], "datasets": [], "now": "2026-12-01T00:00:00Z"}
        })
    };
    let eval = |name: &str, tenant: &str, extra: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, input(tenant).to_string()).unwrap();
        let policies = common::workspace_root().join("policies");
        Command::new(env!("CARGO_BIN_EXE_sandgate"))
            .args(["policy", "eval", "--input"])
            .arg(&path)
            .arg("--policy-dir")
            .arg(policies)
            .args(extra)
            .output()
            .unwrap()
    };
    let allowed = eval("acme.json", "acme", &["--fail-on-deny"]);
    assert!(allowed.status.success(), "{allowed:?}");
    let answer: Value = serde_json::from_slice(&allowed.stdout).unwrap();
    assert!(
        answer["revision"].as_str().unwrap().starts_with("sha256:"),
        "{answer}"
    );
    assert_eq!(answer["decision"]["allow"], true, "{answer}");
    let denied = eval("nobody.json", "nobody", &[]);
    assert!(
        denied.status.success(),
        "without --fail-on-deny: {denied:?}"
    );
    let denied = eval("nobody.json", "nobody", &["--fail-on-deny"]);
    assert_eq!(denied.status.code(), Some(1), "{denied:?}");
    let answer: Value = serde_json::from_slice(&denied.stdout).unwrap();
    assert_eq!(answer["decision"]["allow"], false, "{answer}");
    assert!(Path::new(dir.path()).exists());
}

/// A gzip'd tar written entry by entry with raw names, as a hostile client could.
fn tarball(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(encoder);
    for (name, kind, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if *kind == tar::EntryType::Symlink {
            let target = b"/etc/passwd";
            header.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        }
        header.set_entry_type(*kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_uploaded_bundle_is_unpacked_safely_and_reloaded() {
    let shipped = copy_of_shipped();
    let policy_dir = shipped.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
    })
    .await;
    let admin = gw.key("admin", "ops").await;
    let (first, _) = revision(&gw, &admin).await;

    // From the command line: the directory here, packed and sent.
    let candidate = variant("uploaded");
    let out = sandgate(
        &gw,
        &admin,
        &[
            "policy",
            "reload",
            "--upload",
            candidate.path().to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let (uploaded, kept) = revision(&gw, &admin).await;
    assert_ne!(uploaded, first);
    assert_eq!(kept, vec![uploaded.clone(), first.clone()]);

    // Hostile archives are refused, nothing lands outside the upload's own directory, and the
    // active bundle stays.
    let upload = |body: Vec<u8>| {
        gw.http
            .post(format!("{}/v1/policy/reload", gw.url))
            .bearer_auth(&admin)
            .header("content-type", "application/gzip")
            .body(body)
            .send()
    };
    let rego = b"package sandgate.execution\n";
    for (body, why) in [
        (
            tarball(&[("../escape.rego", tar::EntryType::Regular, rego)]),
            "names must be relative",
        ),
        (
            tarball(&[("/tmp/abs.rego", tar::EntryType::Regular, rego)]),
            "names must be relative",
        ),
        (
            tarball(&[("link.rego", tar::EntryType::Symlink, b"")]),
            "only regular files and directories",
        ),
        (b"not an archive".to_vec(), "not a gzip'd tar"),
    ] {
        let answer = upload(body).await.unwrap();
        assert_eq!(answer.status(), 409, "{why}");
        let answer: Value = answer.json().await.unwrap();
        let reason = answer["error"]["reasons"][0]["message"].as_str().unwrap();
        assert!(reason.contains(why), "{why}: {answer}");
        assert_eq!(revision(&gw, &admin).await.0, uploaded);
    }
    let incoming = gw.data_dir.path().join("policy-incoming");
    assert!(!incoming.join("escape.rego").exists());
    assert!(!gw.data_dir.path().join("escape.rego").exists());
    assert_eq!(
        std::fs::read_dir(&incoming).unwrap().count(),
        0,
        "unpacked uploads are removed"
    );

    let pool = gw.pool().await;
    let sources: Vec<(bool, String)> = sqlx::query_as(
        "SELECT allow, input ->> 'source' FROM audit_events WHERE kind = 'policy.reload' \
         ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    let expected: Vec<(bool, String)> = [true, false, false, false, false]
        .iter()
        .map(|allow| (*allow, "upload".to_owned()))
        .collect();
    assert_eq!(sources, expected);
    gw.stop().await;
}
