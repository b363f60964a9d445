//! Edited, hidden and cut bundles: each caught against the chain and its anchored head.

use chrono::{SecondsFormat, Utc};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::forger::*;
use crate::common::TestGateway;

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_event_relinked_to_the_next_omitted_one_does_not_verify() {
    let gw = TestGateway::start().await;
    interleaved_denials(&gw).await;
    let dir = tempfile::tempdir().unwrap();
    for format in ["jsonl", "ocsf"] {
        let bundle = dir.path().join(format!("acme.{format}"));
        export(&gw, &bundle, &["--tenant", "acme", "--format", format]);
        let (ok, said) = verify_offline(&bundle, &[]);
        assert!(ok && said.starts_with("ok events "), "{said}");

        // The forgery: acme's denial recorded as an allow (in the decision, which no OCSF field
        // is made from), its hash recomputed, the next (omitted) line's prev_hash following it,
        // and the proof's digest made again.
        let mut lines = records(&bundle);
        let at = event_before_omitted(&lines);
        let row = row_mut(&mut lines[at]).unwrap();
        let original = row["hash"].clone();
        assert_eq!(row["decision"]["allow"], false, "{row}");
        row["decision"]["allow"] = json!(true);
        row["hash"] = json!(row_hash(row));
        assert_ne!(row["hash"], original);
        let forged_hash = row["hash"].clone();
        lines[at + 1]["prev_hash"] = forged_hash;
        reprove(&mut lines);
        let forged = write(&lines, &dir.path().join(format!("forged.{format}")));
        let (ok, said) = verify_offline(&forged, &[]);
        assert!(!ok, "{format}: an edited event verified: {said}");
        assert!(
            said.contains("does not follow from its seq, at, prev_hash"),
            "{format}: {said}"
        );
        println!("{format}: edited and relinked: {said}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_event_hidden_as_omitted_does_not_verify() {
    let gw = TestGateway::start().await;
    interleaved_denials(&gw).await;
    let dir = tempfile::tempdir().unwrap();
    for format in ["jsonl", "ocsf"] {
        let bundle = dir.path().join(format!("acme.{format}"));
        export(&gw, &bundle, &["--tenant", "acme", "--format", format]);
        let lines = records(&bundle);
        let at = event_before_omitted(&lines);

        // Hidden with everything anyone holding the event can compute: its links and parts.
        let mut forged = lines.clone();
        let row = row_mut(&mut forged[at]).unwrap().clone();
        forged[at] = hidden(&row);
        reprove(&mut forged);
        let path = write(&forged, &dir.path().join(format!("hidden.{format}")));
        let (ok, said) = verify_offline(&path, &[]);
        assert!(!ok, "{format}: a hidden event verified: {said}");
        assert!(said.contains("hidden as another's"), "{format}: {said}");
        println!("{format}: hidden with its parts: {said}");

        // Hidden by its links alone, as an event of the old scheme would be: not proven.
        let mut forged = lines.clone();
        let mut bare = hidden(&row);
        bare.as_object_mut().unwrap().remove("parts");
        forged[at] = bare;
        reprove(&mut forged);
        let path = write(&forged, &dir.path().join(format!("bare.{format}")));
        let (ok, said) = verify_offline(&path, &[]);
        assert!(!ok, "{format}: a hidden event verified: {said}");
        assert!(said.starts_with("unproven "), "{format}: {said}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bundle_is_checked_through_an_anchored_head() {
    let gw = TestGateway::start().await;
    interleaved_denials(&gw).await;
    let dir = tempfile::tempdir().unwrap();
    let head = anchor(&gw);
    let head_arg = ["--head", head.as_str()];

    let bundle = dir.path().join("all.jsonl");
    export(&gw, &bundle, &[]);
    let (ok, said) = verify_offline(&bundle, &head_arg);
    assert!(ok, "{said}");
    assert!(said.contains("matches the anchored head"), "{said}");
    let filtered = dir.path().join("acme.jsonl");
    export(&gw, &filtered, &["--tenant", "acme"]);
    let (ok, said) = verify_offline(&filtered, &head_arg);
    assert!(ok, "{said}");

    // The last two events cut off, the proof rewritten to match (its digest too): consistent on
    // its own, so only the anchor shows what is missing.
    let mut lines = records(&bundle);
    let links: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i]["bundle"] == "event")
        .collect();
    for i in links[links.len() - 2..].iter().rev() {
        lines.remove(*i);
    }
    reprove(&mut lines);
    let cut = write(&lines, &dir.path().join("cut.jsonl"));
    let (ok, said) = verify_offline(&cut, &[]);
    assert!(ok, "the cut bundle is consistent on its own: {said}");
    let (ok, said) = verify_offline(&cut, &head_arg);
    assert!(
        !ok,
        "a bundle without its tail verified against the anchor: {said}"
    );
    assert!(said.contains("before the anchored head"), "{said}");
    println!("tail removed: {said}");

    // Cut, but the head the chain had at export left as it was: found without an anchor.
    let mut lines = records(&bundle);
    let chain = lines.last().unwrap()["chain"].clone();
    for i in links[links.len() - 2..].iter().rev() {
        lines.remove(*i);
    }
    reprove(&mut lines);
    lines.last_mut().unwrap()["chain"] = chain;
    let n = lines.len();
    let mut digest = Sha256::new();
    for line in &lines[..n - 1] {
        digest.update((line.to_string() + "\n").as_bytes());
    }
    lines[n - 1]["digest"] = json!(hex::encode(digest.finalize()));
    let cut = write(&lines, &dir.path().join("cut-naive.jsonl"));
    let (ok, said) = verify_offline(&cut, &[]);
    assert!(!ok, "{said}");
    assert!(said.contains("removed from its end"), "{said}");

    // Every hash from the first event on made again after an edit: consistent on its own, but
    // the anchored event's hash is not the anchor's.
    let mut lines = records(&filtered);
    let at = event_before_omitted(&lines);
    row_mut(&mut lines[at]).unwrap()["decision"]["allow"] = json!(true);
    relink(&mut lines, at);
    let rehashed = write(&lines, &dir.path().join("rehashed.jsonl"));
    let (ok, said) = verify_offline(&rehashed, &[]);
    assert!(ok, "a rehashed slice is consistent on its own: {said}");
    let (ok, said) = verify_offline(&rehashed, &head_arg);
    assert!(!ok, "a rehashed slice verified against the anchor: {said}");
    assert!(said.contains("not the anchored head's"), "{said}");

    // A window that ends before the anchor: the bundle carries the links after it to the head,
    // so the anchor (and a later one) is still checked.
    let until = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let acme = gw.key("agent", "acme").await;
    let (status, body) = gw.execute(&acme, "cobol", "late-q7z", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let later = anchor(&gw);
    let (status, body) = gw.execute(&acme, "cobol", "later-q7z", json!({})).await;
    assert_eq!(status, 403, "{body}");
    let past = dir.path().join("past.jsonl");
    export(&gw, &past, &["--tenant", "acme", "--until", &until]);
    let lines = records(&past);
    assert!(
        lines.iter().any(|l| l["bundle"] == "after"),
        "no links after"
    );
    assert!(!std::fs::read_to_string(&past).unwrap().contains("q7z"));
    for head in [&head, &later] {
        let (ok, said) = verify_offline(&past, &["--head", head]);
        assert!(ok, "{head}: {said}");
        assert!(said.contains("matches the anchored head"), "{said}");
    }
    let (ok, said) = verify_offline(&past, &["--head", &format!("{}:{}", 1, &GENESIS)]);
    assert!(!ok, "{said}");
    assert!(said.contains("not the anchored head's"), "{said}");
    gw.stop().await;
}
