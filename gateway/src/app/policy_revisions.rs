//! The last N accepted policy bundles, kept under `<data_dir>/policy-revisions/<hex>/` so that
//! `POST /v1/policy/rollback` (and `sandgate policy rollback`) can bring one back without the
//! directory it came from. Each holds the bundle's files and its `tests/`, as accepted, and an
//! `activated` file (the last time it became active), by which the store orders and prunes.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Most files, and bytes, one kept bundle may hold (bundle files plus its tests).
const MAX_FILES: usize = 10_000;
const MAX_BYTES: u64 = 64 * 1024 * 1024;
const ACTIVATED: &str = "activated";

#[derive(Debug, Clone)]
pub struct RevisionStore {
    root: PathBuf,
    keep: usize,
}

/// One kept revision, as `GET /v1/policy` lists them.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct KeptRevision {
    pub revision: String,
    pub activated_at: DateTime<Utc>,
}

impl RevisionStore {
    /// `keep` revisions under `root` (at least 1: the active one).
    pub fn new(root: PathBuf, keep: usize) -> RevisionStore {
        RevisionStore {
            root,
            keep: keep.max(1),
        }
    }

    /// The directory of `revision` (`sha256:<64 hex>`), if it is well formed.
    fn dir_of(&self, revision: &str) -> Option<PathBuf> {
        let hex = revision.strip_prefix("sha256:")?;
        (hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| self.root.join(hex))
    }

    /// Where `revision` is kept, if it is.
    pub fn path_of(&self, revision: &str) -> Option<PathBuf> {
        self.dir_of(revision)
            .filter(|dir| dir.join(ACTIVATED).is_file())
    }

    /// Keeps the bundle `revision` (its `files`, loaded from `source`), marks it active now, and prunes
    /// the oldest beyond `keep`.
    pub fn keep_active(
        &self,
        source: &Path,
        revision: &str,
        files: &[String],
    ) -> std::io::Result<()> {
        let dir = self
            .dir_of(revision)
            .ok_or_else(|| std::io::Error::other(format!("odd revision {revision:?}")))?;
        if !dir.join(ACTIVATED).is_file() {
            let incoming = self
                .root
                .join(format!(".incoming-{}", uuid::Uuid::new_v4()));
            let copied = copy_bundle(source, files, &incoming);
            if let Err(err) = copied.and_then(|()| {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::rename(&incoming, &dir)
            }) {
                let _ = std::fs::remove_dir_all(&incoming);
                return Err(err);
            }
        }
        std::fs::write(dir.join(ACTIVATED), Utc::now().to_rfc3339())?;
        self.prune()
    }

    /// Kept revisions, the most recently active first.
    pub fn list(&self) -> Vec<KeptRevision> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut kept: Vec<KeptRevision> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let stamp = std::fs::read_to_string(entry.path().join(ACTIVATED)).ok()?;
                Some(KeptRevision {
                    revision: format!("sha256:{name}"),
                    activated_at: DateTime::parse_from_rfc3339(stamp.trim()).ok()?.into(),
                })
            })
            .filter(|kept| self.dir_of(&kept.revision).is_some())
            .collect();
        kept.sort_by_key(|kept| std::cmp::Reverse(kept.activated_at));
        kept
    }

    /// The revision active before `current`: the newest kept one that is not `current`.
    pub fn previous(&self, current: &str) -> Option<String> {
        self.list()
            .into_iter()
            .map(|kept| kept.revision)
            .find(|revision| revision != current)
    }

    fn prune(&self) -> std::io::Result<()> {
        for old in self.list().into_iter().skip(self.keep) {
            if let Some(dir) = self.dir_of(&old.revision) {
                std::fs::remove_dir_all(dir)?;
            }
        }
        Ok(())
    }
}

/// Copies the bundle's `files` and its `tests/` tree (regular files, no symlinks followed out
/// of it) from `source` to `target`, within [`MAX_FILES`] and [`MAX_BYTES`].
fn copy_bundle(source: &Path, files: &[String], target: &Path) -> std::io::Result<()> {
    let mut names: Vec<String> = files.to_vec();
    list_tree(&source.join("tests"), "tests", &mut names)?;
    if names.len() > MAX_FILES {
        return Err(std::io::Error::other(format!(
            "the bundle has more than {MAX_FILES} files to keep"
        )));
    }
    let mut bytes = 0;
    for name in names {
        let to = target.join(&name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        bytes += std::fs::copy(source.join(&name), &to)?;
        if bytes > MAX_BYTES {
            return Err(std::io::Error::other(format!(
                "the bundle holds more than {MAX_BYTES} bytes to keep"
            )));
        }
    }
    Ok(())
}

fn list_tree(dir: &Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') || out.len() > MAX_FILES {
            continue;
        }
        let kind = entry.file_type()?;
        let rel = format!("{rel}/{name}");
        if kind.is_dir() {
            list_tree(&entry.path(), &rel, out)?;
        } else if kind.is_file() {
            out.push(rel);
        }
    }
    Ok(())
}
