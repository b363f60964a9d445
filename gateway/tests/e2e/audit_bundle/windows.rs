//! A window's edges: its last events passed off as after it, its first ones dropped.

use chrono::{SecondsFormat, Utc};
use serde_json::{json, Value};

use super::forger::*;
use crate::common::TestGateway;

/// Issue 21 item 8, found in review: acme's last event of the window and every line after it
/// in the window shown as `after` lines, with the parts anyone holding their content computes,
/// and the proof rewritten. An event's time is part of its scheme-2 hash (its stamp), so an
/// `after` line proves it is not of the window.
#[tokio::test(flavor = "multi_thread")]
async fn the_windows_last_events_passed_off_as_after_it_do_not_verify() {
    let gw = TestGateway::start().await;
    interleaved_denials(&gw).await;
    let dir = tempfile::tempdir().unwrap();
    let head = anchor(&gw);
    let head_arg = ["--head", head.as_str()];
    for tenant in [Some("acme"), None] {
        let name = tenant.unwrap_or("all");
        let bundle = export_as(&gw, dir.path(), tenant, &[]);
        let (ok, said) = verify_offline(&bundle, &head_arg);
        assert!(ok, "{said}");
        let lines = records(&bundle);
        let last_acme = *acme_events(&lines).last().unwrap();
        let moved: Vec<usize> = window_lines(&lines)
            .into_iter()
            .filter(|&i| i >= last_acme)
            .collect();
        let mut forged = lines.clone();
        for &i in &moved {
            let mut line = match row_mut(&mut forged[i].clone()) {
                Some(row) => hidden(row),
                None => forged[i].clone(),
            };
            line["bundle"] = json!("after");
            forged[i] = line;
        }
        reprove(&mut forged);
        let path = write(&forged, &dir.path().join(format!("{name}-as-after.jsonl")));
        let (ok, said) = verify_offline(&path, &head_arg);
        assert!(
            !ok,
            "{name}: window events passed off as after it verified: {said}"
        );
        assert!(said.contains("inside the window"), "{name}: {said}");
        println!("{name}: window events as after lines: {said}");

        // Their times moved to the window's end: their hashes no longer follow.
        let until = lines[0]["until"].clone();
        for &i in &moved {
            forged[i]["parts"]["at"] = until.clone();
        }
        reprove(&mut forged);
        let path = write(&forged, &dir.path().join(format!("{name}-moved.jsonl")));
        let (ok, said) = verify_offline(&path, &head_arg);
        assert!(
            !ok,
            "{name}: events with their times moved verified: {said}"
        );
        assert!(
            said.contains("does not follow from its seq, at"),
            "{name}: {said}"
        );
    }
    gw.stop().await;
}

/// Issue 21 item 8, found in review: the window's first lines removed, up to and including
/// acme's first event, the proof rewritten. Consistent on its own and with the anchored head:
/// only a start anchor (`--from`) shows it, and without one verify says the start is not
/// anchored instead of that it starts at the chain's first event.
#[tokio::test(flavor = "multi_thread")]
async fn events_removed_from_the_windows_start_are_caught_by_a_start_anchor() {
    let gw = TestGateway::start().await;
    interleaved_denials(&gw).await;
    let dir = tempfile::tempdir().unwrap();
    let head = anchor(&gw);
    for tenant in [Some("acme"), None] {
        let name = tenant.unwrap_or("all");
        let bundle = export_as(&gw, dir.path(), tenant, &[]);
        let (ok, said) = verify_offline(&bundle, &["--head", &head]);
        assert!(
            ok && said.contains("starts at the chain's first event"),
            "{said}"
        );
        let (ok, said) = verify_offline(&bundle, &["--head", &head, "--from", "0"]);
        assert!(ok, "{said}");
        assert!(
            said.contains("starts right after the anchored event 0"),
            "{said}"
        );

        let lines = records(&bundle);
        let first_acme = acme_events(&lines)[0];
        let window = window_lines(&lines);
        let mut forged: Vec<Value> = (0..lines.len())
            .filter(|i| !(window.contains(i) && *i <= first_acme))
            .map(|i| lines[i].clone())
            .collect();
        reprove(&mut forged);
        let path = write(&forged, &dir.path().join(format!("{name}-cut.jsonl")));
        let (ok, said) = verify_offline(&path, &["--head", &head]);
        assert!(
            ok,
            "{name}: the cut bundle is consistent on its own: {said}"
        );
        assert!(
            !said.contains("starts at the chain's first event"),
            "{said}"
        );
        assert!(said.contains("the start is not anchored"), "{said}");
        let (ok, said) = verify_offline(&path, &["--head", &head, "--from", "0"]);
        assert!(!ok, "{name}: a bundle without its start verified: {said}");
        assert!(
            said.contains("not right after the start anchor's event 0"),
            "{said}"
        );
        println!("{name}: start removed: {said}");
    }

    // Consecutive windows: the second starts right after the first one's last event.
    let t1 = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    interleaved_denials(&gw).await;
    let head = anchor(&gw);
    let before = dir.path().join("before.jsonl");
    export(&gw, &before, &["--tenant", "acme", "--until", &t1]);
    let (ok, said) = verify_offline(&before, &["--head", &head, "--from", "0"]);
    assert!(ok, "{said}");
    let last = records(&before).last().unwrap()["last"].clone();
    let from = format!("{}:{}", last["seq"], last["hash"].as_str().unwrap());
    let since = dir.path().join("since.jsonl");
    export(&gw, &since, &["--tenant", "acme", "--since", &t1]);
    let (ok, said) = verify_offline(&since, &["--head", &head, "--from", &from]);
    assert!(ok, "{said}");
    let expected = format!("starts right after the anchored event {}", last["seq"]);
    assert!(said.contains(&expected), "{said}");
    let wrong = format!("{}:{}", last["seq"], "ab".repeat(32));
    let (ok, said) = verify_offline(&since, &["--head", &head, "--from", &wrong]);
    assert!(
        !ok && said.contains("not to the start anchor's event"),
        "{said}"
    );

    let lines = records(&since);
    let first_acme = acme_events(&lines)[0];
    let window = window_lines(&lines);
    let mut forged: Vec<Value> = (0..lines.len())
        .filter(|i| !(window.contains(i) && *i <= first_acme))
        .map(|i| lines[i].clone())
        .collect();
    reprove(&mut forged);
    let path = write(&forged, &dir.path().join("since-cut.jsonl"));
    let (ok, said) = verify_offline(&path, &["--head", &head, "--from", &from]);
    assert!(!ok, "a bundle without its start verified: {said}");
    assert!(said.contains("not right after the start anchor"), "{said}");
    gw.stop().await;
}

/// Found in review: a line whose `seq` no event can have (the largest, 0, negative) is refused
/// with a reason, never a panic.
#[tokio::test(flavor = "multi_thread")]
async fn a_line_with_an_impossible_seq_is_refused_without_a_panic() {
    let gw = TestGateway::start().await;
    interleaved_denials(&gw).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = export_as(&gw, dir.path(), Some("acme"), &[]);
    let lines = records(&bundle);
    let omitted = lines.iter().find(|l| l["bundle"] == "omitted").unwrap();
    let mut bare = omitted.clone();
    bare.as_object_mut().unwrap().remove("parts");
    let event = lines.iter().find(|l| l["bundle"] == "event").unwrap();
    let cases = [
        (bare.clone(), i64::MAX, "not a sequence number of a chain"),
        (omitted.clone(), i64::MAX, "does not follow from its seq"),
        (bare.clone(), 0, "not a sequence number of a chain"),
        (bare, -7, "not a sequence number of a chain"),
        (event.clone(), 0, "not a sequence number of a chain"),
    ];
    for (n, (mut line, seq, expected)) in cases.into_iter().enumerate() {
        match row_mut(&mut line) {
            Some(row) => row["seq"] = json!(seq),
            None => line["seq"] = json!(seq),
        }
        let path = write(
            &[lines[0].clone(), line],
            &dir.path().join(format!("seq{n}.jsonl")),
        );
        let (ok, said) = verify_offline(&path, &[]);
        assert!(!ok, "seq {seq}: {said}");
        assert!(!said.contains("panicked"), "seq {seq}: {said}");
        assert!(said.contains(expected), "seq {seq}: {said}");
    }
    gw.stop().await;
}
