//! What checking a bundle found: the report of an intact bundle ([`BundleReport`]) and the
//! ways a bundle fails ([`BundleError`]).

use super::anchors::{Anchor, Start};
use super::{Header, Proof};
use crate::audit::chain;

/// Scheme-1 events (written before scheme 2) that the bundle shows without their content: their
/// hashes cannot be recomputed, only taken as given, so nothing after them vouches for what
/// comes before them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unproven {
    pub first: i64,
    pub last: i64,
    pub count: u64,
}

/// What an intact bundle holds.
#[derive(Debug, Clone)]
pub struct BundleReport {
    pub header: Header,
    pub proof: Proof,
    /// Revisions whose files were in the bundle and hash to them.
    pub revisions_checked: Vec<String>,
    /// Revisions recorded without files (before sandgate stored them): named, not recomputed.
    pub revisions_without_files: Vec<String>,
    /// The anchor the bundle was checked against (its event at `seq` has that hash).
    pub anchor: Option<Anchor>,
    /// What is proven about where it starts.
    pub start: Start,
    /// Links taken as given: when set, the bundle is intact as far as it can tell but does not
    /// prove the events up to `unproven.last` (verify says `unproven`, not `ok`).
    pub unproven: Option<Unproven>,
}

impl BundleReport {
    /// Every link was recomputed: nothing in the bundle is taken as given.
    pub fn proven(&self) -> bool {
        self.unproven.is_none()
    }

    /// What `sandgate audit verify --bundle` prints for a bundle with no broken link.
    pub fn summary(&self) -> String {
        let verdict = if self.proven() { "ok" } else { "unproven" };
        let mut summary = format!("{verdict} {}", self.ends());
        if let Some(anchor) = &self.anchor {
            summary.push_str(&format!("; matches the anchored head {}", anchor.seq));
        }
        match self.start {
            Start::ChainStart => summary.push_str("; starts at the chain's first event"),
            Start::AfterAnchor(seq) => {
                summary.push_str(&format!("; starts right after the anchored event {seq}"))
            }
            Start::Unanchored => {}
        }
        summary.push_str(&format!(
            "; {} policy revisions recomputed; chain at export: {}",
            self.revisions_checked.len(),
            self.proof.chain.summary()
        ));
        if let Some(unproven) = &self.unproven {
            summary.push_str(&format!(
                "\nunproven: {} events shown without content and without the parts of their \
                 hash (events {}..{}): events written before hash scheme 2, whose hashes can only \
                 be taken as given (or events stripped of their parts). So the events up to {} \
                 are checked only against this bundle's own hashes, and a head vouches only for \
                 the events after it. Export a window covering them without --tenant to check \
                 them (docs/audit.md, \"Export\")",
                unproven.count, unproven.first, unproven.last, unproven.last
            ));
        }
        if !self.revisions_without_files.is_empty() {
            summary.push_str(&format!(
                "\nnote: policy revisions stored without their files (not recomputed): {}",
                self.revisions_without_files.join(", ")
            ));
        }
        if let Some(tenant) = &self.header.tenant {
            summary.push_str(&format!(
                "\nnote: filtered to tenant {tenant}: the {} omitted events are shown by their \
                 links and content hashes only",
                self.proof.omitted
            ));
        }
        if let (Start::Unanchored, Some(first)) = (self.start, &self.proof.first) {
            summary.push_str(&format!(
                "\nnote: the start is not anchored: nothing shows that no event before event {} \
                 (of the window or not) was removed; give --from SEQ:HASH (the last event of the \
                 bundle before this one, or 0 for the chain's start) to check it",
                first.seq
            ));
        }
        summary
    }

    fn ends(&self) -> String {
        let proof = &self.proof;
        match (&proof.first, &proof.last, &proof.head) {
            (Some(first), Some(last), Some(head)) => {
                format!(
                "events {}..{} ({} with content, {} omitted) of the window {} to {}, last hash {}; \
                 linked to the head at export, event {} ({} events after the window), hash {}",
                first.seq, last.seq, proof.events, proof.omitted, chain::time_text(&self.header.since),
                chain::time_text(&self.header.until), last.hash, head.seq, proof.after, head.hash
            )
            }
            _ => format!(
                "no events in the window {} to {}",
                chain::time_text(&self.header.since),
                chain::time_text(&self.header.until)
            ),
        }
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
    #[error("{0}")]
    Anchor(String),
}
