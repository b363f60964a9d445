//! Audit export bundles: a slice of the chain an auditor checks offline, with no database.
//!
//! A bundle is one file of JSON lines, each an object tagged by `"bundle"`:
//! `header` first; then, in `seq` order, one `event` (or `ocsf_event`) per exported event and one
//! `omitted` per event a tenant filter left out, then one `after` per event from the window's end
//! to the chain's head at export (both [`Hidden`]: links and the content's hash, never the
//! content); then one `policy_revision` per revision the exported events name, with the bundle
//! files; `proof` last. [`check`] walks it from the first event to the head as the database walk
//! does ([`super::verify::check`], the chain's one hash definition in [`super::chain`]).
//! `docs/audit.md` ("Export") says what a bundle proves.

mod anchors;
pub mod check;
mod export;
pub mod ocsf;
mod report;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use policy_engine::SourceFile;

use super::verify::{StoredEvent, Verification};

pub use export::{ExportError, ExportRequest, ExportSummary};

/// `header.format` of every bundle.
pub const FORMAT: &str = "sandgate.audit.bundle";
/// `header.version` this code writes and reads.
pub const VERSION: u32 = 2;
/// The longest line a bundle may hold (an event or a policy revision with its files).
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;
/// The most events (exported and omitted) one bundle may hold: narrow `--since`/`--until` past it.
pub const MAX_EVENTS: i64 = 50_000_000;

/// How events are written: sandgate's own rows, or OCSF records carrying the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventFormat {
    Jsonl,
    Ocsf,
}

/// One line of a bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "bundle", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    Header(Header),
    Event {
        event: StoredEvent,
    },
    /// An OCSF record; its `unmapped.sandgate` is the row, and the rest is made from it.
    OcsfEvent {
        ocsf: Value,
    },
    /// An event in the slice that the tenant filter left out.
    Omitted(Hidden),
    /// An event after the window, up to the chain's head when the bundle was made.
    After(Hidden),
    PolicyRevision(PolicyRevision),
    Proof(Proof),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub event_format: EventFormat,
    /// Events from the first one at or after `since` to the last one before `until`, by `seq`.
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Only this tenant's events carry content; the others are `omitted`.
    pub tenant: Option<String>,
    pub exported_at: DateTime<Utc>,
}

/// An event shown without its content: its links, and for a scheme-2 event the parts its `hash`
/// is recomputed from ([`super::chain::link_parts`]), its time among them. A scheme-1 event has
/// no parts: its `hash` (and so its time) can only be taken as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hidden {
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Parts>,
}

/// What a scheme-2 event's hash is made of besides `prev_hash`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parts {
    /// The event's time: with the line's `seq`, what [`super::chain::stamp`] hashes, so it is
    /// proven (an event after the window shows it is not of the window).
    pub at: DateTime<Utc>,
    /// [`super::chain::tenant_tag`]: checked against the bundle's tenant.
    pub tenant_tag: String,
    /// [`super::chain::content_hash`].
    pub content_hash: String,
}

/// A policy revision the exported events name, with its bundle files (`None`: recorded before
/// sandgate stored bundle files, so the revision cannot be recomputed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRevision {
    pub revision: String,
    pub loaded_by: String,
    pub loaded_at: DateTime<Utc>,
    pub files: Option<Vec<SourceFile>>,
}

/// The last line: what the slice is and what the database's own walk found when it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proof {
    /// The window's first and last events; `None` when the window held no events.
    pub first: Option<Link>,
    pub last: Option<Link>,
    /// Events written with their content.
    pub events: u64,
    /// Events of the window left out by the tenant filter.
    pub omitted: u64,
    /// Events after the window, up to `head`.
    pub after: u64,
    /// The bundle's last link: the chain's head as `chain` found it (`None` when the window held
    /// no events).
    pub head: Option<Link>,
    /// `sandgate audit verify` over the whole chain at export time.
    pub chain: Verification,
    /// sha256 (hex) of every byte of the bundle before this line.
    pub digest: String,
}

/// One end of the slice: an event's `seq`, the hash it links to and its own hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
}

impl Link {
    fn of(seq: i64, prev_hash: &str, hash: &str) -> Link {
        Link {
            seq,
            prev_hash: prev_hash.to_owned(),
            hash: hash.to_owned(),
        }
    }
}
