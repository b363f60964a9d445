//! The forger's tools: exporting and verifying bundles with the real binary, and rewriting
//! their lines from the hash definitions in docs/audit.md.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use common::TestGateway;

pub(super) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

pub(super) fn sandgate(url: &str, data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .env("SANDGATE_DATABASE_URL", url)
        .env("SANDGATE_DATA_DIR", data_dir)
        .output()
        .unwrap()
}

pub(super) fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `audit verify --bundle FILE [ARGS]` with no database at all: (success, stdout + stderr).
pub(super) fn verify_offline(bundle: &Path, args: &[&str]) -> (bool, String) {
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
pub(super) fn export(gw: &TestGateway, out: &Path, extra: &[&str]) {
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
pub(super) fn anchor(gw: &TestGateway) -> String {
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

pub(super) fn records(bundle: &Path) -> Vec<Value> {
    std::fs::read_to_string(bundle)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

pub(super) fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hex::encode(hasher.finalize())
}

/// The row a line carries (`event`, or the row inside an OCSF record), if it carries one.
pub(super) fn row_mut(line: &mut Value) -> Option<&mut Value> {
    match line["bundle"].as_str()? {
        "event" => Some(&mut line["event"]),
        "ocsf_event" => Some(&mut line["ocsf"]["unmapped"]["sandgate"]),
        _ => None,
    }
}

/// docs/audit.md: `at` in RFC 3339, UTC, with microseconds.
pub(super) fn time_text(at: &Value) -> String {
    let at = DateTime::parse_from_rfc3339(at.as_str().unwrap()).unwrap();
    at.with_timezone(&Utc)
        .to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// docs/audit.md: the row's fields but its links, as compact JSON with sorted keys, `at` with
/// microseconds.
pub(super) fn canonical(row: &Value) -> String {
    let mut fields = row.as_object().unwrap().clone();
    for link in ["prev_hash", "hash", "hash_version"] {
        fields.remove(link);
    }
    let at = time_text(&fields["at"]);
    fields.insert("at".into(), Value::String(at));
    Value::Object(fields).to_string()
}

pub(super) fn tenant_tag(seq: &Value, tenant: &Value) -> String {
    sha256_hex(&[json!({"seq": seq, "tenant": tenant}).to_string().as_bytes()])
}

pub(super) fn stamp(seq: &Value, at: &Value) -> String {
    let json = json!({"at": time_text(at), "seq": seq});
    sha256_hex(&[json.to_string().as_bytes()])
}

/// A scheme-2 link from a hidden line's `seq`, `prev_hash` and `parts`.
pub(super) fn link_parts(line: &Value) -> String {
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
pub(super) fn row_hash(row: &Value) -> String {
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
pub(super) fn hidden(row: &Value) -> Value {
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
pub(super) fn relink(lines: &mut [Value], from: usize) {
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

pub(super) fn link_of(line: &Value) -> Value {
    let row = match line["bundle"].as_str().unwrap() {
        "event" => &line["event"],
        "ocsf_event" => &line["ocsf"]["unmapped"]["sandgate"],
        _ => line,
    };
    json!({"seq": row["seq"], "prev_hash": row["prev_hash"], "hash": row["hash"]})
}

/// Rewrites the proof to what the lines hold (ends, counts, the head the chain "had") and its
/// digest: everything a forger without an anchor can make consistent.
pub(super) fn reprove(lines: &mut [Value]) {
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

pub(super) fn write(lines: &[Value], path: &Path) -> PathBuf {
    let body: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(path, body).unwrap();
    path.to_owned()
}

/// Four denials, alternating between two tenants' keys: events of acme and globex interleave.
pub(super) async fn interleaved_denials(gw: &TestGateway) {
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
pub(super) fn event_before_omitted(lines: &[Value]) -> usize {
    (0..lines.len() - 1)
        .find(|&i| {
            let mut line = lines[i].clone();
            let is_acme = row_mut(&mut line).is_some_and(|row| row["tenant"] == "acme");
            is_acme && lines[i + 1]["bundle"] == "omitted"
        })
        .expect("an acme event followed by an omitted one")
}

/// The indexes of the window's lines (`event`, `ocsf_event`, `omitted`).
pub(super) fn window_lines(lines: &[Value]) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| {
            ["event", "ocsf_event", "omitted"].contains(&lines[i]["bundle"].as_str().unwrap())
        })
        .collect()
}

/// The indexes of acme's events shown with content.
pub(super) fn acme_events(lines: &[Value]) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| row_mut(&mut lines[i].clone()).is_some_and(|row| row["tenant"] == "acme"))
        .collect()
}

/// The bundle `--tenant acme` (`Some`) or unfiltered (`None`) as `NAME.jsonl` in `dir`.
pub(super) fn export_as(
    gw: &TestGateway,
    dir: &Path,
    tenant: Option<&str>,
    extra: &[&str],
) -> PathBuf {
    let name = tenant.unwrap_or("all");
    let bundle = dir.join(format!("{name}.jsonl"));
    let mut args = extra.to_vec();
    if let Some(tenant) = tenant {
        args.extend_from_slice(&["--tenant", tenant]);
    }
    export(gw, &bundle, &args);
    bundle
}
