//! Checking a bundle offline (`sandgate audit verify --bundle FILE [--head SEQ:HASH]`), with no
//! database: every event's hash is recomputed with the chain's own definition, from its content
//! or, for an event shown without it, from its content's hash, and linked to the one before it,
//! from the first event to the chain's head at export (and through an anchored head); OCSF
//! records are remade from their rows, every policy revision named is present and its files hash
//! to it, and the proof matches what the walk found.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};

use chrono::{DateTime, SubsecRound, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{ocsf, EventFormat, Header, Hidden, Link, Parts, PolicyRevision, Proof, Record};
use super::{FORMAT, MAX_LINE_BYTES, VERSION};
use crate::audit::chain;
use crate::audit::verify::{self, StoredEvent};

use super::anchors::is_sha256;
pub use super::anchors::{Anchor, AnchorError, Anchors, Start, StartAnchor, StartAnchorError};
pub use super::report::{BundleError, BundleReport, Unproven};

/// The walk's state between lines.
#[derive(Default)]
struct Walk {
    header: Option<Header>,
    /// The seq and prev_hash the next event must have.
    next: Option<(i64, String)>,
    /// The window's ends.
    first: Option<Link>,
    last: Option<Link>,
    /// The last link walked.
    head: Option<Link>,
    events: u64,
    omitted: u64,
    after: u64,
    unproven: Option<Unproven>,
    /// The anchors to meet, and whether they were met.
    anchors: Anchors,
    anchored: bool,
    started: bool,
    /// Revision -> the first event naming it.
    named: BTreeMap<String, i64>,
    /// Revision -> whether its files were recomputed.
    revisions: BTreeMap<String, bool>,
    proof: Option<Proof>,
    /// Every byte before the proof line.
    digest: Sha256,
}

/// Checks the bundle read from `reader` (against `anchor`, when given); the error names the first
/// problem and its line.
pub fn verify_bundle(
    mut reader: impl BufRead,
    anchors: Anchors,
) -> Result<BundleReport, BundleError> {
    let mut walk = Walk {
        anchors,
        ..Walk::default()
    };
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
            Record::Omitted(hidden) => self.omitted(hidden),
            Record::After(hidden) => self.after(hidden),
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
        self.in_window(event.seq)?;
        valid_seq(event.seq)?;
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
        self.linked(Link::of(event.seq, &event.prev_hash, &event.hash), true)
    }

    /// Events of the window (with content or omitted) come before every `after` line.
    fn in_window(&self, seq: i64) -> Result<(), String> {
        if self.after > 0 {
            return Err(format!("event {seq} of the window after events past it"));
        }
        Ok(())
    }

    fn omitted(&mut self, hidden: Hidden) -> Result<(), String> {
        self.in_window(hidden.seq)?;
        if self.header.as_ref().is_some_and(|h| h.tenant.is_none()) {
            return Err(format!(
                "event {} omitted from a bundle without a tenant filter",
                hidden.seq
            ));
        }
        let tenant = self.header.as_ref().and_then(|h| h.tenant.clone());
        let (link, _) = self.hidden(hidden, "omitted", tenant.as_deref())?;
        self.omitted += 1;
        self.linked(link, true)
    }

    fn after(&mut self, hidden: Hidden) -> Result<(), String> {
        if self.head.is_none() {
            return Err(format!(
                "event {} after the window, but the window holds no event",
                hidden.seq
            ));
        }
        let (link, at) = self.hidden(hidden, "after the window", None)?;
        if let Some(at) = at {
            self.past_window(link.seq, at)?;
        }
        self.after += 1;
        self.linked(link, false)
    }

    /// An `after` line's event, whose time its parts prove, is not in the window: none of the
    /// window's events (of the bundle's tenant, or any in an unfiltered bundle) can be hidden
    /// as after it. Not "at or after `until`": a replica whose clock lags can write an event
    /// after the window with a time before `since`.
    fn past_window(&self, seq: i64, at: DateTime<Utc>) -> Result<(), String> {
        let Some(header) = &self.header else {
            return Ok(());
        };
        if header.since <= at && at < header.until {
            return Err(format!(
                "event {seq} after the window: its time {} is inside the window {} to {} \
                 (an event of the window shown as one after it)",
                chain::time_text(&at),
                chain::time_text(&header.since),
                chain::time_text(&header.until)
            ));
        }
        Ok(())
    }

    /// Checks an event shown without content: it links to the one before, and its hash follows
    /// from its parts (scheme 2) or, with none (scheme 1), is taken as given. With `tenant`, the
    /// event must not be that tenant's. Returns its link and, from its parts, its proven time.
    fn hidden(
        &mut self,
        hidden: Hidden,
        what: &str,
        tenant: Option<&str>,
    ) -> Result<(Link, Option<DateTime<Utc>>), String> {
        let seq = hidden.seq;
        valid_seq(seq)?;
        if let Some((next, prev)) = &self.next {
            if seq != *next {
                return Err(format!("expected event {next} next: events are missing"));
            }
            if hidden.prev_hash != *prev {
                return Err(format!(
                    "{what} event {seq}: prev_hash does not match the previous event's hash"
                ));
            }
        }
        if !is_sha256(&hidden.hash) || !is_sha256(&hidden.prev_hash) {
            return Err(format!("{what} event {seq}: not a sha256 hash"));
        }
        let at = match &hidden.parts {
            Some(parts) => Some(
                check_parts(&hidden, parts, tenant)
                    .map_err(|problem| format!("{what} event {seq}: {problem}"))?,
            ),
            None => {
                self.unproven(seq);
                None
            }
        };
        Ok((Link::of(seq, &hidden.prev_hash, &hidden.hash), at))
    }

    fn unproven(&mut self, seq: i64) {
        let unproven = self.unproven.get_or_insert(Unproven {
            first: seq,
            last: seq,
            count: 0,
        });
        unproven.last = seq;
        unproven.count += 1;
    }

    /// `link` is the next one walked (of the window, or after it): the anchors are checked here.
    fn linked(&mut self, link: Link, window: bool) -> Result<(), String> {
        // A forged `seq` must not wrap (release builds) or panic (debug builds).
        let next = link
            .seq
            .checked_add(1)
            .filter(|_| link.seq >= 1)
            .ok_or_else(|| format!("event {}: not a sequence number of a chain", link.seq))?;
        if let Some(from) = &self.anchors.from {
            if from.seq.checked_add(1) == Some(link.seq) {
                if from.hash != link.prev_hash {
                    return Err(format!(
                        "event {} links to {}, not to the start anchor's event {} ({}): the \
                         chain before it was changed, or the anchor is of another chain",
                        link.seq, link.prev_hash, from.seq, from.hash
                    ));
                }
                self.started = true;
            }
        }
        if let Some(anchor) = &self.anchors.head {
            if anchor.seq == link.seq {
                if anchor.hash != link.hash {
                    return Err(format!(
                        "event {} has hash {}, not the anchored head's {}: the chain up to it \
                         was changed, or the anchor is of another chain",
                        link.seq, link.hash, anchor.hash
                    ));
                }
                self.anchored = true;
            }
        }
        self.next = Some((next, link.hash.clone()));
        if window {
            self.first.get_or_insert_with(|| link.clone());
            self.last = Some(link.clone());
        }
        self.head = Some(link);
        Ok(())
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
        if (&self.head, self.after) != (&proof.head, proof.after) {
            return Err(format!(
                "the proof says the bundle ends at {} after {} events past the window, but it \
                 ends at {} after {}",
                describe(&proof.head),
                proof.after,
                describe(&self.head),
                self.after
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
        reaches_head(&proof)?;
        self.proof = Some(proof);
        Ok(())
    }

    fn finish(self) -> Result<BundleReport, BundleError> {
        let (Some(header), Some(proof)) = (self.header, self.proof) else {
            return Err(BundleError::Incomplete(
                "the bundle ends before its proof (truncated)".to_owned(),
            ));
        };
        if let (Some(anchor), false) = (&self.anchors.head, self.anchored) {
            return Err(BundleError::Anchor(unmet(anchor, &proof)));
        }
        if let (Some(from), false) = (&self.anchors.from, self.started) {
            return Err(BundleError::Anchor(unmet_start(from, &proof)));
        }
        let start = match (&self.anchors.from, &proof.first) {
            (Some(from), _) => Start::AfterAnchor(from.seq),
            (None, Some(first)) if first.seq == 1 && first.prev_hash == chain::GENESIS => {
                Start::ChainStart
            }
            (None, _) => Start::Unanchored,
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
            anchor: self.anchors.head,
            start,
            unproven: self.unproven,
        })
    }
}

/// The bundle's last link is the head the database's walk found when it was made: no event was
/// removed from the end since (a forger who also rewrites the proof is caught by an anchor).
fn reaches_head(proof: &Proof) -> Result<(), String> {
    let Some(head) = &proof.head else {
        return Ok(());
    };
    if proof.chain.head.as_deref() != Some(head.hash.as_str()) || proof.chain.events != head.seq {
        return Err(format!(
            "the bundle ends at event {} ({}), but the chain's head at export was event {} ({}): \
             events were removed from its end",
            head.seq,
            head.hash,
            proof.chain.events,
            proof.chain.head.as_deref().unwrap_or("none")
        ));
    }
    Ok(())
}

/// Why the anchor was not met: the bundle does not reach it, or starts after it.
fn unmet(anchor: &Anchor, proof: &Proof) -> String {
    match (&proof.first, &proof.head) {
        (Some(first), Some(_)) if anchor.seq < first.seq => format!(
            "the anchored head {} precedes the bundle's first event {}: it vouches for none of \
             it (anchor a later head; a head just before the window is a start: --from)",
            anchor.seq, first.seq
        ),
        (_, Some(head)) => format!(
            "the bundle ends at event {}, before the anchored head {}: events were removed from \
             its end, or it was made from another chain",
            head.seq, anchor.seq
        ),
        _ => format!(
            "the bundle holds no events, so it cannot be checked against the anchored head {}",
            anchor.seq
        ),
    }
}

/// Why the start anchor was not met: the bundle starts after the event following it (events
/// are missing from its start), or ends before it.
fn unmet_start(from: &StartAnchor, proof: &Proof) -> String {
    match (&proof.first, &proof.head) {
        (Some(first), _) if first.seq > from.seq.saturating_add(1) => format!(
            "the bundle starts at event {}, not right after the start anchor's event {}: the \
             events between are not in it (removed from its start, or the window starts later)",
            first.seq, from.seq
        ),
        (_, Some(head)) => format!(
            "the bundle ends at event {}, before the start anchor's event {} (it starts after \
             the bundle)",
            head.seq, from.seq
        ),
        _ => format!(
            "the bundle holds no events, so it cannot start after the start anchor's event {}",
            from.seq
        ),
    }
}

/// Every `seq` is at least 1 (the first event's): a line claiming less is not of a chain.
fn valid_seq(seq: i64) -> Result<(), String> {
    if seq < 1 {
        return Err(format!(
            "event {seq}: not a sequence number of a chain (the first is 1)"
        ));
    }
    Ok(())
}

/// A scheme-2 hidden event's hash follows from its parts, and (with `tenant`) its tenant tag is
/// not that tenant's: none of the tenant's events can be passed off as another's. Returns its
/// time, which its hash commits to (through the stamp).
fn check_parts(
    hidden: &Hidden,
    parts: &Parts,
    tenant: Option<&str>,
) -> Result<DateTime<Utc>, String> {
    if !is_sha256(&parts.tenant_tag) || !is_sha256(&parts.content_hash) {
        return Err("its parts are not sha256 hashes".to_owned());
    }
    // The stamp hashes `at` to the microsecond: finer digits are not part of what is proven.
    let at = parts.at.trunc_subsecs(6);
    let linked = chain::link_parts(
        &hidden.prev_hash,
        &chain::stamp(hidden.seq, &at),
        &parts.tenant_tag,
        &parts.content_hash,
    );
    if linked != hidden.hash {
        return Err(
            "its hash does not follow from its seq, at, prev_hash, tenant_tag and \
                    content_hash (modified)"
                .to_owned(),
        );
    }
    if let Some(tenant) = tenant {
        if chain::tenant_tag(hidden.seq, Some(tenant)) == parts.tenant_tag {
            return Err(format!(
                "it is an event of the bundle's tenant {tenant}, hidden as another's"
            ));
        }
    }
    Ok(at)
}

fn describe(link: &Option<Link>) -> String {
    link.as_ref().map_or("none".to_owned(), |link| {
        format!("{} ({})", link.seq, link.hash)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_is_seq_colon_sha256() {
        let hash = "ab".repeat(32);
        let anchor: Anchor = format!("12:{}", hash.to_uppercase()).parse().unwrap();
        assert_eq!(anchor, Anchor { seq: 12, hash });
        assert_eq!(anchor.to_string().parse::<Anchor>().unwrap(), anchor);
        let zero = format!("0:{}", "a".repeat(64));
        for bad in ["12", "12 abab", zero.as_str(), "x:abc"] {
            assert!(bad.parse::<Anchor>().is_err(), "{bad}");
        }
        assert!(format!("7:{}", "g".repeat(64)).parse::<Anchor>().is_err());
    }

    /// A forged `seq` at the end of `i64` (or below 1) is an error, never an overflow.
    #[test]
    fn a_sequence_number_out_of_range_is_refused_not_wrapped() {
        let header = r#"{"bundle":"header","format":"sandgate.audit.bundle","version":2,"event_format":"jsonl","since":"2026-12-01T00:00:00Z","until":"2026-12-02T00:00:00Z","tenant":"acme","exported_at":"2026-12-02T00:00:00Z"}"#;
        for seq in [i64::MAX, 0, -5] {
            let omitted = format!(
                r#"{{"bundle":"omitted","seq":{seq},"prev_hash":"{}","hash":"{}"}}"#,
                "a".repeat(64),
                "b".repeat(64)
            );
            let bundle = format!("{header}\n{omitted}\n");
            let outcome = verify_bundle(bundle.as_bytes(), Anchors::default());
            assert!(outcome.is_err(), "seq {seq}: {outcome:?}");
        }
    }

    #[test]
    fn a_start_is_seq_colon_sha256_or_the_chains_start() {
        let genesis = StartAnchor {
            seq: 0,
            hash: chain::GENESIS.to_owned(),
        };
        assert_eq!("0".parse::<StartAnchor>().unwrap(), genesis);
        let zeros = format!("0:{}", chain::GENESIS);
        assert_eq!(zeros.parse::<StartAnchor>().unwrap(), genesis);
        let hash = "cd".repeat(32);
        let start: StartAnchor = format!("41:{hash}").parse().unwrap();
        assert_eq!(start, StartAnchor { seq: 41, hash });
        let other = format!("0:{}", "a".repeat(64));
        let negative = format!("-1:{}", "a".repeat(64));
        for bad in ["", "1", other.as_str(), negative.as_str(), "3:abc"] {
            assert!(bad.parse::<StartAnchor>().is_err(), "{bad}");
        }
    }
}
