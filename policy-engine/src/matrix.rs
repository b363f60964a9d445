//! The golden decision matrix: the bundle decides every combination of tenant, language,
//! network request and mount request, one line each, kept in `tests/decisions.out`. Any change
//! of behaviour shows up as a diff of that file, which a reviewer reads like code.
//! `sandgate policy test` checks it (`--bless` rewrites it); `tests/decisions.rs` checks the
//! shipped bundle's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::{Decision, Environment, HostPort, PolicyEngine, PolicyInput, Principal, RequestInput};

/// Where a bundle keeps its matrix, relative to the bundle directory.
pub const MATRIX_FILE: &str = "tests/decisions.out";

/// What comparing a bundle's decisions with its matrix found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixCheck {
    /// The file matches the bundle's decisions.
    Matches,
    /// The bundle has no matrix file (nothing to check).
    Absent,
    /// Lines that differ (`- old`, `+ new`), as [`diff`] prints them.
    Differs(String),
    /// `--bless`: the file was (re)written from the bundle's decisions.
    Blessed,
}

/// Compares `dir`'s matrix file with `engine`'s decisions, or rewrites it when `bless`.
pub fn check(engine: &PolicyEngine, dir: &Path, bless: bool) -> std::io::Result<MatrixCheck> {
    let path = dir.join(MATRIX_FILE);
    let actual = matrix(engine);
    if bless {
        std::fs::write(&path, &actual)?;
        return Ok(MatrixCheck::Blessed);
    }
    let expected = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(MatrixCheck::Absent),
        Err(err) => return Err(err),
    };
    if expected == actual {
        return Ok(MatrixCheck::Matches);
    }
    let changes = diff(&expected, &actual);
    Ok(MatrixCheck::Differs(if changes.is_empty() {
        "(only comments or line order differ)\n".to_owned()
    } else {
        changes
    }))
}

const TENANTS: &[&str] = &["acme", "forge", "classroom", "nosuch"];
const LANGUAGES: &[&str] = &["python", "bash", "ruby"];
const NETWORK: &[Option<(&str, u16)>] =
    &[None, Some(("pypi.org", 443)), Some(("evil.example", 443))];
const MOUNTS: &[Option<&str>] = &[None, Some("dataset:census"), Some("dataset:secret")];

const HEADER: &str = "\
# Golden decision matrix of the shipped policy (policy-engine/src/matrix.rs).
# Input: tenant, language, the one network destination asked for (net=) and the one mount asked
# for (mounts=); no limits asked; the gateway offers backends gvisor and runc and dataset census.
# Output: allow | deny | review (allowed once a reviewer approves), the backend, the network grant
# (host:ports), the datasets mounted, the limits (timeout_ms/memory_mb/cpus/pids/disk_mb/
# output_bytes) and the reason codes. `-` is none.
# Regenerate: sandgate policy test policies --bless
";

fn input(
    tenant: &str,
    language: &str,
    net: Option<(&str, u16)>,
    mount: Option<&str>,
) -> PolicyInput {
    PolicyInput {
        principal: Principal {
            key_id: "key_matrix".into(),
            tenant: tenant.into(),
            role: "agent".into(),
        },
        request: RequestInput {
            language: language.into(),
            code_sha256: "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9".into(),
            code_bytes: 8,
            network: net
                .map(|(host, port)| HostPort {
                    host: host.into(),
                    port,
                })
                .into_iter()
                .collect(),
            mounts: mount.map(str::to_owned).into_iter().collect(),
            ..RequestInput::default()
        },
        environment: Environment {
            backends: vec!["gvisor".into(), "runc".into()],
            datasets: vec!["census".into()],
            now: "2025-01-01T00:00:00Z".into(),
        },
    }
}

fn or_dash(items: Vec<String>) -> String {
    if items.is_empty() {
        "-".to_string()
    } else {
        items.join(",")
    }
}

fn describe(decision: &Decision) -> String {
    let verdict = match (decision.allow, decision.require_approval) {
        (false, _) => "deny",
        (true, false) => "allow",
        (true, true) => "review",
    };
    let grant = decision
        .network
        .iter()
        .flat_map(|grant| &grant.allow)
        .map(|rule| {
            let ports: Vec<String> = rule.ports.iter().map(u16::to_string).collect();
            format!("{}:{}", rule.host, ports.join("+"))
        })
        .collect();
    let mounts = decision
        .mounts
        .iter()
        .map(|mount| {
            let mode = if mount.read_only { "ro" } else { "rw" };
            format!("{}@{}:{mode}", mount.dataset, mount.target)
        })
        .collect();
    let limits = decision.limits.as_ref().map_or("-".to_string(), |l| {
        format!(
            "{}/{}/{}/{}/{}/{}",
            l.timeout_ms, l.memory_mb, l.cpus, l.pids, l.disk_mb, l.output_bytes
        )
    });
    let reasons = decision.reasons.iter().map(|r| r.code.clone()).collect();
    format!(
        "{verdict} backend={} grant={} mounts={} limits={limits} reasons={}",
        decision.backend.as_deref().unwrap_or("-"),
        or_dash(grant),
        or_dash(mounts),
        or_dash(reasons),
    )
}

/// The matrix text: the header, then one line per combination of the dimensions above.
pub fn matrix(engine: &PolicyEngine) -> String {
    let mut out = HEADER.to_string();
    for tenant in TENANTS {
        for language in LANGUAGES {
            for net in NETWORK {
                for mount in MOUNTS {
                    let decision = engine.decide(&input(tenant, language, *net, *mount));
                    let net = net.map_or("-".to_string(), |(host, port)| format!("{host}:{port}"));
                    let _ = writeln!(
                        out,
                        "{tenant} {language} net={net} mounts={} => {}",
                        mount.unwrap_or("-"),
                        describe(&decision)
                    );
                }
            }
        }
    }
    out
}

/// Line by line, keyed by the input half of each line: what changed, what appeared, what went.
pub fn diff(expected: &str, actual: &str) -> String {
    let keyed = |text: &str| -> BTreeMap<String, String> {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| match line.split_once(" => ") {
                Some((key, value)) => (key.to_string(), value.to_string()),
                None => (line.to_string(), String::new()),
            })
            .collect()
    };
    let (expected, actual) = (keyed(expected), keyed(actual));
    let mut out = String::new();
    for (key, old) in &expected {
        match actual.get(key) {
            Some(new) if new == old => {}
            Some(new) => {
                let _ = writeln!(out, "- {key} => {old}\n+ {key} => {new}");
            }
            None => {
                let _ = writeln!(out, "- {key} => {old}");
            }
        }
    }
    for (key, new) in &actual {
        if !expected.contains_key(key) {
            let _ = writeln!(out, "+ {key} => {new}");
        }
    }
    out
}
