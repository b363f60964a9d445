//! The heads a bundle is checked against, kept outside the database: `--head SEQ:HASH` (the
//! chain's head at some time, [`Anchor`]) and `--start` (where the bundle's window must begin,
//! [`StartAnchor`]), parsed from the command line.

use std::fmt;
use std::str::FromStr;

use crate::audit::chain;

/// A head kept outside the database (`sandgate audit head` prints it), as `SEQ:HASH`: the
/// bundle's event `seq` must have this hash, so nothing up to it can be changed or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    pub seq: i64,
    pub hash: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a head: expected SEQ:HASH, as `sandgate audit head` prints it")]
pub struct AnchorError(String);

impl FromStr for Anchor {
    type Err = AnchorError;
    fn from_str(text: &str) -> Result<Anchor, AnchorError> {
        let bad = || AnchorError(text.to_owned());
        let (seq, hash) = seq_hash(text).ok_or_else(bad)?;
        if seq < 1 {
            return Err(bad());
        }
        Ok(Anchor { seq, hash })
    }
}

/// `SEQ:HASH` with a lowercase sha256 `HASH`.
fn seq_hash(text: &str) -> Option<(i64, String)> {
    let (seq, hash) = text.trim().split_once(':')?;
    let seq = seq.parse::<i64>().ok()?;
    is_sha256(hash).then(|| (seq, hash.to_ascii_lowercase()))
}

/// Where the bundle must start (`--from SEQ:HASH`): right after event `seq`, whose hash is
/// `hash`, such as the last event of the previous bundle an auditor checked (or `0`, the chain's
/// start). The bundle must hold event `seq + 1` and link it to `hash`, so no event after `seq`
/// can be missing from its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartAnchor {
    pub seq: i64,
    pub hash: String,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not a start: expected SEQ:HASH (an event the bundle must start right after, such as \
     the previous bundle's last event), or 0 for the chain's start"
)]
pub struct StartAnchorError(String);

impl FromStr for StartAnchor {
    type Err = StartAnchorError;
    fn from_str(text: &str) -> Result<StartAnchor, StartAnchorError> {
        let bad = || StartAnchorError(text.to_owned());
        if text.trim() == "0" {
            return Ok(StartAnchor {
                seq: 0,
                hash: chain::GENESIS.to_owned(),
            });
        }
        let (seq, hash) = seq_hash(text).ok_or_else(bad)?;
        if seq < 0 || (seq == 0 && hash != chain::GENESIS) {
            return Err(bad());
        }
        Ok(StartAnchor { seq, hash })
    }
}

/// The anchors a bundle is checked against: its end (`--head`) and its start (`--from`).
#[derive(Debug, Clone, Default)]
pub struct Anchors {
    pub head: Option<Anchor>,
    pub from: Option<StartAnchor>,
}

/// What a bundle proves about its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Its first event is the chain's first (`seq` 1, linked to the genesis hash).
    ChainStart,
    /// It starts right after the start anchor's event (`--from`).
    AfterAnchor(i64),
    /// Nothing: events before its first one (of the window or not) could have been removed.
    Unanchored,
}

impl fmt::Display for Anchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

/// A SHA-256 in hex (either case).
pub(super) fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}
