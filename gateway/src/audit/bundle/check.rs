//! Checking a bundle offline (`sandgate audit verify --bundle FILE`), with no database: every
//! exported event's hash is recomputed with the chain's own definition and linked to the one
//! before it, OCSF records are remade from their rows, every policy revision named is present and
//! its files hash to it, and the proof matches what the walk found.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{ocsf, EventFormat, Header, Link, PolicyRevision, Proof, Record};
use super::{FORMAT, MAX_LINE_BYTES, VERSION};
use crate::audit::verify::{self, StoredEvent};

/// What an intact bundle holds.
#[derive(Debug, Clone)]
pub struct BundleReport {
    pub header: Header,
    pub proof: Proof,
    /// Revisions whose files were in the bundle and hash to them.
    pub revisions_checked: Vec<String>,
    /// Revisions recorded without files (before sandgate stored them): named, not recomputed.
    pub revisions_without_files: Vec<String>,
}

impl BundleReport {
    /// What `sandgate audit verify --bundle` prints for an intact bundle.
    pub fn summary(&self) -> String {
        let ends = match (&self.proof.first, &self.proof.last) {
            (Some(first), Some(last)) => format!(
                "events {}..{} ({} with content, {} omitted), last hash {}",
                first.seq, last.seq, self.proof.events, self.proof.omitted, last.hash
            ),
            _ => "no events in the window".to_owned(),
        };
        let mut summary = format!(
            "ok {ends}; {} policy revisions recomputed; chain at export: {}",
            self.revisions_checked.len(),
            self.proof.chain.summary()
        );
        if !self.revisions_without_files.is_empty() {
            summary.push_str(&format!(
                "\nnote: policy revisions stored without their files (not recomputed): {}",
                self.revisions_without_files.join(", ")
            ));
        }
        if let Some(tenant) = &self.header.tenant {
            summary.push_str(&format!(
                "\nnote: filtered to tenant {tenant}: the {} omitted events are links only; \
                 their hashes are taken as given (see docs/audit.md, \"Export\")",
                self.proof.omitted
            ));
        }
        summary
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("reading the bundle: {0}")]
    Read(#[from] std::io::Error),
    #[error("line {line}: {problem}")]
    Line { line: u64, problem: String },
    #[error("{0}")]
    Incomplete(String),
}

/// The walk's state between lines.
#[derive(Default)]
struct Walk {
    header: Option<Header>,
    /// The seq and prev_hash the next event must have.
    next: Option<(i64, String)>,
    first: Option<Link>,
    last: Option<Link>,
    events: u64,
    omitted: u64,
    /// Revision -> the first event naming it.
    named: BTreeMap<String, i64>,
    /// Revision -> whether its files were recomputed.
    revisions: BTreeMap<String, bool>,
    proof: Option<Proof>,
    /// Every byte before the proof line.
    digest: Sha256,
}

/// Checks the bundle read from `reader`; the error names the first problem and its line.
pub fn verify_bundle(mut reader: impl BufRead) -> Result<BundleReport, BundleError> {
    let mut walk = Walk::default();
    let mut line = 0;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let limit = (MAX_LINE_BYTES + 1) as u64;
        if (&mut reader).take(limit).read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        line += 1;
        let at = |problem: String| BundleError::Line { line, problem };
        if buf.len() > MAX_LINE_BYTES {
            return Err(at(format!("longer than {MAX_LINE_BYTES} bytes")));
        }
        if walk.proof.is_some() {
            return Err(at("a record after the proof".to_owned()));
        }
        let record: Record = serde_json::from_slice(&buf)
            .map_err(|err| at(format!("not a bundle record: {err}")))?;
        if !matches!(record, Record::Proof(_)) {
            walk.digest.update(&buf);
        }
        walk.step(record).map_err(at)?;
    }
    walk.finish()
}

impl Walk {
    fn step(&mut self, record: Record) -> Result<(), String> {
        let Some(header) = &self.header else {
            return self.start(record);
        };
        let format = header.event_format;
        match record {
            Record::Header(_) => Err("a second header".to_owned()),
            Record::Event { event } if format == EventFormat::Jsonl => self.event(event),
            Record::OcsfEvent { ocsf } if format == EventFormat::Ocsf => self.ocsf_event(&ocsf),
            Record::Event { .. } | Record::OcsfEvent { .. } => Err(format!(
                "an event in another format than the header's {format:?}"
            )),
            Record::Omitted {
                seq,
                prev_hash,
                hash,
            } => self.omitted(Link {
                seq,
                prev_hash,
                hash,
            }),
            Record::PolicyRevision(revision) => self.revision(revision),
            Record::Proof(proof) => self.proof(proof),
        }
    }

    fn start(&mut self, record: Record) -> Result<(), String> {
        match record {
            Record::Header(header) if header.format == FORMAT && header.version == VERSION => {
                self.header = Some(header);
                Ok(())
            }
            Record::Header(header) => Err(format!(
                "a header of {} version {}; this sandgate reads {FORMAT} version {VERSION}",
                header.format, header.version
            )),
            _ => Err("the bundle does not start with its header".to_owned()),
        }
    }

    fn ocsf_event(&mut self, record: &Value) -> Result<(), String> {
        let row = ocsf::row_of(record)
            .ok_or_else(|| "an OCSF record without its row in unmapped.sandgate".to_owned())?;
        if ocsf::record(&row) != *record {
            return Err(format!(
                "event {} ({}): the OCSF fields differ from the row they were made from \
                 (modified)",
                row.seq, row.id
            ));
        }
        self.event(row)
    }

    fn event(&mut self, event: StoredEvent) -> Result<(), String> {
        let tenant = self
            .header
            .as_ref()
            .and_then(|header| header.tenant.as_ref());
        if let Some(tenant) = tenant {
            if event.tenant.as_ref() != Some(tenant) {
                return Err(format!(
                    "event {} belongs to tenant {:?}, not the bundle's tenant {tenant}",
                    event.seq, event.tenant
                ));
            }
        }
        let (seq, prev) = self
            .next
            .clone()
            .unwrap_or_else(|| (event.seq, event.prev_hash.clone()));
        if let Some(problem) = verify::check(&event, seq, &prev) {
            return Err(format!("event {} ({}): {problem}", event.seq, event.id));
        }
        if let Some(revision) = &event.policy_revision {
            self.named.entry(revision.clone()).or_insert(event.seq);
        }
        self.events += 1;
        self.linked(Link::of(event.seq, &event.prev_hash, &event.hash));
        Ok(())
    }

    fn omitted(&mut self, link: Link) -> Result<(), String> {
        if self.header.as_ref().is_some_and(|h| h.tenant.is_none()) {
            return Err(format!(
                "event {} omitted from a bundle without a tenant filter",
                link.seq
            ));
        }
        if let Some((seq, prev)) = &self.next {
            if link.seq != *seq {
                return Err(format!("expected event {seq} next: events are missing"));
            }
            if link.prev_hash != *prev {
                return Err(format!(
                    "omitted event {}: prev_hash does not match the previous event's hash",
                    link.seq
                ));
            }
        }
        if link.hash.len() != 64 || !link.hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("omitted event {}: not a sha256 hash", link.seq));
        }
        self.omitted += 1;
        self.linked(link);
        Ok(())
    }

    fn linked(&mut self, link: Link) {
        self.next = Some((link.seq + 1, link.hash.clone()));
        self.first.get_or_insert_with(|| link.clone());
        self.last = Some(link);
    }

    fn revision(&mut self, revision: PolicyRevision) -> Result<(), String> {
        if self.revisions.contains_key(&revision.revision) {
            return Err(format!("policy revision {} twice", revision.revision));
        }
        let checked = match revision.files {
            None => false,
            Some(mut files) => {
                files.sort_by(|a, b| a.path.cmp(&b.path));
                let pairs = files.iter().map(|f| (f.path.as_str(), f.contents.as_str()));
                let recomputed = policy_engine::revision_of(pairs);
                if recomputed != revision.revision {
                    return Err(format!(
                        "policy revision {}: its files hash to {recomputed} (modified)",
                        revision.revision
                    ));
                }
                true
            }
        };
        self.revisions.insert(revision.revision, checked);
        Ok(())
    }

    fn proof(&mut self, proof: Proof) -> Result<(), String> {
        let found = (&self.first, &self.last, self.events, self.omitted);
        if found != (&proof.first, &proof.last, proof.events, proof.omitted) {
            return Err(format!(
                "the proof says events {} .. {} ({} with content, {} omitted) but the bundle \
                 holds {} .. {} ({} with content, {} omitted)",
                describe(&proof.first),
                describe(&proof.last),
                proof.events,
                proof.omitted,
                describe(&self.first),
                describe(&self.last),
                self.events,
                self.omitted
            ));
        }
        let digest = hex::encode(self.digest.clone().finalize());
        if digest != proof.digest {
            return Err("the proof's digest does not match the lines before it \
                        (a line was changed, added or removed)"
                .to_owned());
        }
        if !proof.chain.ok() {
            return Err(format!(
                "the database's chain was broken when this bundle was exported: {}",
                proof.chain.summary()
            ));
        }
        self.proof = Some(proof);
        Ok(())
    }

    fn finish(self) -> Result<BundleReport, BundleError> {
        let (Some(header), Some(proof)) = (self.header, self.proof) else {
            return Err(BundleError::Incomplete(
                "the bundle ends before its proof (truncated)".to_owned(),
            ));
        };
        for (revision, seq) in &self.named {
            if !self.revisions.contains_key(revision) {
                return Err(BundleError::Incomplete(format!(
                    "policy revision {revision}, named by event {seq}, is not in the bundle"
                )));
            }
        }
        let (checked, without): (Vec<_>, Vec<_>) = self
            .revisions
            .into_iter()
            .partition(|(_, checked)| *checked);
        Ok(BundleReport {
            header,
            proof,
            revisions_checked: checked.into_iter().map(|(r, _)| r).collect(),
            revisions_without_files: without.into_iter().map(|(r, _)| r).collect(),
        })
    }
}

fn describe(link: &Option<Link>) -> String {
    link.as_ref().map_or("none".to_owned(), |link| {
        format!("{} ({})", link.seq, link.hash)
    })
}
