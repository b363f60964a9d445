//! Forging an exported audit bundle, through the real binary and a real PostgreSQL: a tenant's
//! event edited with its hash recomputed and the next omitted event relinked, a tenant's event
//! hidden as another tenant's, the end of the chain cut off, the whole slice rehashed; and a
//! chain written with the old hash scheme (scheme 1) still verifying after new events join it,
//! with a filtered bundle that says what it cannot prove instead of `ok`.
//!
//! The forger here is written apart from the gateway's code, from the hash definitions in
//! docs/audit.md, as anyone holding a bundle could write it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use common::TestGateway;

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn sandgate(url: &str, data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .env("SANDGATE_DATABASE_URL", url)
        .env("SANDGATE_DATA_DIR", data_dir)
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `audit verify --bundle FILE [ARGS]` with no database at all: (success, stdout + stderr).
fn verify_offline(bundle: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["audit", "verify", "--bundle"])
        .arg(bundle)
        .args(args)
        .env_remove("SANDGATE_DATABASE_URL")
        .env("SANDGATE_DATA_DIR", "/nonexistent/sandgate-no-data-dir")
        .output()
        .unwrap();
    (output.status.success(), text(&output))
}

/// `audit export --out OUT EXTRA` (`--since 2d` unless EXTRA says otherwise).
fn export(gw: &TestGateway, out: &Path, extra: &[&str]) {
    let mut args = vec!["audit", "export", "--out", out.to_str().unwrap()];
    if !extra.contains(&"--since") {
        args.extend_from_slice(&["--since", "2d"]);
    }
    args.extend_from_slice(extra);
    let output = sandgate(
        gw.database_url.as_deref().unwrap(),
        gw.data_dir.path(),
        &args,
    );
    assert!(output.status.success(), "{}", text(&output));
}

/// `sandgate audit head`: the anchor, as SEQ:HASH.
fn anchor(gw: &TestGateway) -> String {
    let output = sandgate(
        gw.database_url.as_deref().unwrap(),
        gw.data_dir.path(),
        &["audit", "head"],
    );
    assert!(output.status.success(), "{}", text(&output));
    let head = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let (seq, hash) = head.split_once(':').unwrap_or_else(|| panic!("{head}"));
    assert!(
        seq.parse::<i64>().unwrap() > 0 && hash.len() == 64,
        "{head}"
    );
    head
}

fn records(bundle: &Path) -> Vec<Value> {
    std::fs::read_to_string(bundle)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hex::encode(hasher.finalize())
}

/// The row a line carries (`event`, or the row inside an OCSF record), if it carries one.
fn row_mut(line: &mut Value) -> Option<&mut Value> {
    match line["bundle"].as_str()? {
        "event" => Some(&mut line["event"]),
        "ocsf_event" => Some(&mut line["ocsf"]["unmapped"]["sandgate"]),
        _ => None,
    }
}

/// docs/audit.md: `at` in RFC 3339, UTC, with microseconds.
fn time_text(at: &Value) -> String {
    let at = DateTime::parse_from_rfc3339(at.as_str().unwrap()).unwrap();
    at.with_timezone(&Utc)
        .to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// docs/audit.md: the row's fields but its links, as compact JSON with sorted keys, `at` with
/// microseconds.
fn canonical(row: &Value) -> String {
    let mut fields = row.as_object().unwrap().clone();
    for link in ["prev_hash", "hash", "hash_version"] {
        fields.remove(link);
    }
    let at = time_text(&fields["at"]);
    fields.insert("at".into(), Value::String(at));
    Value::Object(fields).to_string()
}

fn tenant_tag(seq: &Value, tenant: &Value) -> String {
    sha256_hex(&[json!({"seq": seq, "tenant": tenant}).to_string().as_bytes()])
}

fn stamp(seq: &Value, at: &Value) -> String {
    let json = json!({"at": time_text(at), "seq": seq});
    sha256_hex(&[json.to_string().as_bytes()])
}

/// A scheme-2 link from a hidden line's `seq`, `prev_hash` and `parts`.
fn link_parts(line: &Value) -> String {
    let parts = &line["parts"];
    sha256_hex(&[
        line["prev_hash"].as_str().unwrap().as_bytes(),
        stamp(&line["seq"], &parts["at"]).as_bytes(),
        parts["tenant_tag"].as_str().unwrap().as_bytes(),
        parts["content_hash"].as_str().unwrap().as_bytes(),
    ])
}

/// A row's hash by its scheme: 1 (or none given, as before schemes existed) hashes the canonical
/// row after `prev_hash`, 2 its stamp, its tenant tag and the hash of the canonical row.
fn row_hash(row: &Value) -> String {
    let prev = row["prev_hash"].as_str().unwrap().as_bytes();
    let canonical = canonical(row);
    match row.get("hash_version").and_then(Value::as_i64) {
        Some(2) => {
            let stamp = stamp(&row["seq"], &row["at"]);
            let tag = tenant_tag(&row["seq"], &row["tenant"]);
            let content = sha256_hex(&[canonical.as_bytes()]);
            sha256_hex(&[prev, stamp.as_bytes(), tag.as_bytes(), content.as_bytes()])
        }
        _ => sha256_hex(&[prev, canonical.as_bytes()]),
    }
}

/// The line an event with content becomes when hidden: its links, and for scheme 2 the parts
/// its hash is made of (which anyone holding the content can compute).
fn hidden(row: &Value) -> Value {
    let mut line = json!({
        "bundle": "omitted",
        "seq": row["seq"],
        "prev_hash": row["prev_hash"],
        "hash": row["hash"],
    });
    if row.get("hash_version").and_then(Value::as_i64) == Some(2) {
        line["parts"] = json!({
            "at": row["at"],
            "tenant_tag": tenant_tag(&row["seq"], &row["tenant"]),
            "content_hash": sha256_hex(&[canonical(row).as_bytes()]),
        });
    }
    line
}

/// Makes every link from line `from` on follow from the one before it (rows rehashed, hidden
/// events relinked from their parts), and the OCSF records and the proof agree.
fn relink(lines: &mut [Value], from: usize) {
    let mut prev: Option<String> = None;
    for line in lines[from..].iter_mut() {
        let kind = line["bundle"].as_str().unwrap().to_owned();
        if let Some(row) = row_mut(line) {
            if let Some(prev) = &prev {
                row["prev_hash"] = json!(prev);
            }
            row["hash"] = json!(row_hash(row));
            prev = Some(row["hash"].as_str().unwrap().to_owned());
        } else if kind == "omitted" || kind == "after" {
            if let Some(prev) = &prev {
                line["prev_hash"] = json!(prev);
            }
            if line.get("parts").is_some() {
                line["hash"] = json!(link_parts(line));
            }
            prev = Some(line["hash"].as_str().unwrap().to_owned());
        }
    }
    reprove(lines);
}

fn link_of(line: &Value) -> Value {
    let row = match line["bundle"].as_str().unwrap() {
        "event" => &line["event"],
        "ocsf_event" => &line["ocsf"]["unmapped"]["sandgate"],
        _ => line,
    };
    json!({"seq": row["seq"], "prev_hash": row["prev_hash"], "hash": row["hash"]})
}

/// Rewrites the proof to what the lines hold (ends, counts, the head the chain "had") and its
/// digest: everything a forger without an anchor can make consistent.
fn reprove(lines: &mut [Value]) {
    let links: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            ["event", "ocsf_event", "omitted", "after"].contains(&l["bundle"].as_str().unwrap())
        })
        .collect();
    let window: Vec<&&Value> = links.iter().filter(|l| l["bundle"] != "after").collect();
    let count = |kind: &str| links.iter().filter(|l| l["bundle"] == kind).count();
    let events = count("event") + count("ocsf_event");
    let (omitted, after) = (count("omitted"), count("after"));
    let first = window.first().map(|l| link_of(l));
    let last = window.last().map(|l| link_of(l));
    let head = links.last().map(|l| link_of(l));
    let proof = lines.last_mut().unwrap();
    assert_eq!(proof["bundle"], "proof");
    proof["first"] = json!(first);
    proof["last"] = json!(last);
    proof["events"] = json!(events);
    proof["omitted"] = json!(omitted);
    if proof.get("after").is_some() {
        proof["after"] = json!(after);
    }
    if proof.get("head").is_some() {
        proof["head"] = json!(head);
    }
    if let Some(head) = &head {
        proof["chain"]["events"] = head["seq"].clone();
        proof["chain"]["head"] = head["hash"].clone();
    }
    let n = lines.len();
    let mut digest = Sha256::new();
    for line in &lines[..n - 1] {
        digest.update(line.to_string().as_bytes());
        digest.update(b"\n");
    }
    lines[n - 1]["digest"] = json!(hex::encode(digest.finalize()));
}

fn write(lines: &[Value], path: &Path) -> PathBuf {
    let body: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(path, body).unwrap();
    path.to_owned()
}

/// Four denials, alternating between two tenants' keys: events of acme and globex interleave.
async fn interleaved_denials(gw: &TestGateway) {
    let acme = gw.key("agent", "acme").await;
    let globex = gw.key("agent", "globex").await;
    for (key, code) in [
        (&acme, "a1"),
        (&globex, "g1"),
        (&acme, "a2"),
        (&globex, "g2"),
    ] {
        let (status, body) = gw.execute(key, "cobol", code, json!({})).await;
        assert_eq!(status, 403, "{body}");
    }
}

/// The index of the first acme event (with content) directly followed by an omitted event.
fn event_before_omitted(lines: &[Value]) -> usize {
    (0..lines.len() - 1)
        .find(|&i| {
            let mut line = lines[i].clone();
            let is_acme = row_mut(&mut line).is_some_and(|row| row["tenant"] == "acme");
            is_acme && lines[i + 1]["bundle"] == "omitted"
        })
        .expect("an acme event followed by an omitted one")
}

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

/// One row as the gateway wrote it before hash schemes: hashed as sha256(prev || canonical), and
/// inserted without naming `hash_version`.
async fn insert_old_row(pool: &sqlx::PgPool, seq: i64, tenant: &str, prev: &str) -> String {
    let at =
        (Utc::now() - chrono::Duration::hours(30)).to_rfc3339_opts(SecondsFormat::Micros, true);
    let mut row = json!({
        "seq": seq, "id": format!("ev_old{seq}"), "at": at, "kind": "execution.decision",
        "execution_id": format!("ex_old{seq}"), "key_id": null, "tenant": tenant,
        "decision_id": format!("dc_old{seq}"), "allow": false,
        "reasons": [{"code": "language.unsupported", "message": "old"}],
        "input": {"request": {"language": "cobol", "code": format!("old {tenant}")}},
        "decision": {"allow": false}, "policy_revision": null, "prev_hash": prev,
    });
    let hash = row_hash(&row);
    row["hash"] = json!(hash);
    sqlx::query(
        "INSERT INTO audit_events (seq, id, at, kind, execution_id, key_id, tenant, decision_id, \
         allow, reasons, input, decision, policy_revision, prev_hash, hash) \
         VALUES ($1, $2, $3::timestamptz, $4, $5, NULL, $6, $7, false, $8, $9, $10, NULL, $11, $12)",
    )
    .bind(seq)
    .bind(row["id"].as_str())
    .bind(&at)
    .bind("execution.decision")
    .bind(row["execution_id"].as_str())
    .bind(tenant)
    .bind(row["decision_id"].as_str())
    .bind(&row["reasons"])
    .bind(&row["input"])
    .bind(&row["decision"])
    .bind(prev)
    .bind(&hash)
    .execute(pool)
    .await
    .unwrap();
    hash
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_the_old_scheme_still_verifies_and_a_filtered_bundle_says_what_it_cannot_prove()
{
    // A database migrated to today, holding a chain the gateway wrote before hash schemes.
    let url = common::fresh_database().await;
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    gateway::database::migrate_as_owner(&options).await.unwrap();
    let pool = sqlx::PgPool::connect_with(options).await.unwrap();
    let mut prev = GENESIS.to_owned();
    for (seq, tenant) in [(1, "acme"), (2, "globex"), (3, "acme"), (4, "globex")] {
        prev = insert_old_row(&pool, seq, tenant, &prev).await;
    }
    // New events join it.
    let gw = TestGateway::start_with(Some(url.clone()), |_| {}).await;
    interleaved_denials(&gw).await;
    let auditor = gw.key("auditor", "audit").await;
    let output = sandgate(&url, gw.data_dir.path(), &["audit", "verify"]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).starts_with("ok "), "{}", text(&output));
    let dir = tempfile::tempdir().unwrap();

    // Filtered to acme: globex's old events are links only and cannot be recomputed.
    let acme = dir.path().join("acme.jsonl");
    export(&gw, &acme, &["--tenant", "acme"]);
    let (ok, said) = verify_offline(&acme, &[]);
    assert!(
        !ok,
        "a bundle with old links taken as given said ok: {said}"
    );
    assert!(said.starts_with("unproven events 1.."), "{said}");
    assert!(
        said.contains(
            "2 events shown without content and without the parts of their hash (events 2..4)"
        ),
        "{said}"
    );
    println!("old links omitted: {said}");

    let versions: Vec<(i64, i16)> =
        sqlx::query_as("SELECT seq, hash_version FROM audit_events ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(versions[..4].iter().all(|(_, v)| *v == 1), "{versions:?}");
    assert!(versions[4..].iter().all(|(_, v)| *v == 2), "{versions:?}");
    assert!(versions.len() > 8, "{versions:?}");
    // The API shows every event's scheme too.
    let (status, page) = gw.get(&auditor, "/v1/audit/events?limit=1000").await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<(i64, i16)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| {
            let version = event["hash_version"].as_i64();
            let version = version.unwrap_or_else(|| panic!("no hash_version: {event}"));
            (event["seq"].as_i64().unwrap(), version as i16)
        })
        .rev()
        .collect();
    assert_eq!(listed, versions, "{page}");
    pool.close().await;
    let output = sandgate(&url, gw.data_dir.path(), &["audit", "verify"]);
    assert!(
        text(&output).starts_with(&format!("ok {} events", versions.len())),
        "{}",
        text(&output)
    );
    let head = anchor(&gw);
    let (ok, said) = verify_offline(&acme, &["--head", &head]);
    assert!(!ok && said.starts_with("unproven "), "{said}");

    // Unfiltered, the old events carry their content and are recomputed: proven.
    let all = dir.path().join("all.jsonl");
    export(&gw, &all, &[]);
    let (ok, said) = verify_offline(&all, &["--head", &head]);
    assert!(ok, "{said}");
    assert!(said.starts_with("ok events 1.."), "{said}");

    // A window of new events only: every omitted link is recomputed.
    let recent = dir.path().join("recent.jsonl");
    export(&gw, &recent, &["--tenant", "acme", "--since", "1h"]);
    let (ok, said) = verify_offline(&recent, &["--head", &head]);
    assert!(ok, "{said}");
    assert!(said.contains("filtered to tenant acme"), "{said}");
    gw.stop().await;
}

/// The indexes of the window's lines (`event`, `ocsf_event`, `omitted`).
fn window_lines(lines: &[Value]) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| {
            ["event", "ocsf_event", "omitted"].contains(&lines[i]["bundle"].as_str().unwrap())
        })
        .collect()
}

/// The indexes of acme's events shown with content.
fn acme_events(lines: &[Value]) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| row_mut(&mut lines[i].clone()).is_some_and(|row| row["tenant"] == "acme"))
        .collect()
}

/// The bundle `--tenant acme` (`Some`) or unfiltered (`None`) as `NAME.jsonl` in `dir`.
fn export_as(gw: &TestGateway, dir: &Path, tenant: Option<&str>, extra: &[&str]) -> PathBuf {
    let name = tenant.unwrap_or("all");
    let bundle = dir.join(format!("{name}.jsonl"));
    let mut args = extra.to_vec();
    if let Some(tenant) = tenant {
        args.extend_from_slice(&["--tenant", tenant]);
    }
    export(gw, &bundle, &args);
    bundle
}

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
