//! Finding, reading and fingerprinting the files of a policy bundle (a `policies/` directory).
//!
//! Layout rules (also in `policies/README.md`):
//! - every `*.rego` file under the directory is a policy, except under the top-level `tests/`;
//! - every `*.yaml` / `*.yml` file under the top-level `data/` is data: its top-level mapping is
//!   merged into `data`, and two files defining the same top-level key is an error;
//! - entries whose name starts with `.` (editor swap files, `..data` of Kubernetes volumes) are
//!   skipped; symbolic links to files are followed, symbolic links to directories are not;
//! - everything else (README.md, test cases) is not part of the bundle.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::PolicyError;

/// Directory at the bundle root holding test cases; never part of the bundle.
const TESTS_DIR: &str = "tests";
/// Directory at the bundle root holding YAML data.
const DATA_DIR: &str = "data";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    Rego,
    Data,
}

/// One file of the bundle, read into memory.
#[derive(Debug)]
pub(crate) struct BundleFile {
    /// Path relative to the bundle root, `/`-separated.
    pub(crate) rel: String,
    pub(crate) path: PathBuf,
    pub(crate) kind: FileKind,
    pub(crate) contents: String,
}

/// Reads every bundle file under `dir`, sorted by relative path.
pub(crate) fn read_bundle(dir: &Path) -> Result<Vec<BundleFile>, PolicyError> {
    let mut found = Vec::new();
    walk(dir, "", &mut found)?;
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
        .into_iter()
        .map(|(rel, path, kind)| {
            let contents = fs::read_to_string(&path).map_err(|err| PolicyError::Read {
                path: path.clone(),
                err,
            })?;
            Ok(BundleFile {
                rel,
                path,
                kind,
                contents,
            })
        })
        .collect()
}

fn walk(
    dir: &Path,
    rel_dir: &str,
    found: &mut Vec<(String, PathBuf, FileKind)>,
) -> Result<(), PolicyError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |err| PolicyError::Read { path, err }
    };
    for entry in fs::read_dir(dir).map_err(read_err(dir))? {
        let entry = entry.map_err(read_err(dir))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            let err = std::io::Error::new(std::io::ErrorKind::InvalidData, "name is not UTF-8");
            return Err(PolicyError::Read { path, err });
        };
        if name.starts_with('.') {
            continue;
        }
        let rel = if rel_dir.is_empty() {
            name.clone()
        } else {
            format!("{rel_dir}/{name}")
        };
        let file_type = entry.file_type().map_err(read_err(&path))?;
        if file_type.is_dir() {
            if rel != TESTS_DIR {
                walk(&path, &rel, found)?;
            }
            continue;
        }
        let Some(kind) = classify(&rel) else {
            continue;
        };
        // Follows a symbolic link to a file; a link to a directory is not descended into.
        if fs::metadata(&path).map_err(read_err(&path))?.is_file() {
            found.push((rel, path, kind));
        }
    }
    Ok(())
}

fn classify(rel: &str) -> Option<FileKind> {
    if rel.ends_with(".rego") {
        Some(FileKind::Rego)
    } else if in_data_dir(rel) && (rel.ends_with(".yaml") || rel.ends_with(".yml")) {
        Some(FileKind::Data)
    } else {
        None
    }
}

fn in_data_dir(rel: &str) -> bool {
    rel.strip_prefix(DATA_DIR)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// One file of a bundle as stored with its revision: the path relative to the bundle root and
/// the contents. `sandgate audit export` writes these; `audit verify` recomputes the revision.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceFile {
    pub path: String,
    pub contents: String,
}

/// `sha256:<hex>` over the manifest `<relative path> NUL <sha256 hex of contents> LF`, one line per
/// file in sorted path order. `policies/README.md` shows how to recompute it with coreutils.
pub(crate) fn revision(files: &[BundleFile]) -> String {
    revision_of(
        files
            .iter()
            .map(|file| (file.rel.as_str(), file.contents.as_str())),
    )
}

/// [`revision`] of `(relative path, contents)` pairs given in sorted path order: the one
/// definition, for a bundle read from disk and for one read back from an audit export.
pub fn revision_of<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut manifest = Sha256::new();
    for (rel, contents) in files {
        manifest.update(rel.as_bytes());
        manifest.update([0u8]);
        manifest.update(hex::encode(Sha256::digest(contents.as_bytes())).as_bytes());
        manifest.update(b"\n");
    }
    format!("sha256:{}", hex::encode(manifest.finalize()))
}

/// Parses every data file, checks its host patterns (`crate::hosts`) and merges their top-level
/// mappings into one `data` document.
pub(crate) fn merge_data(files: &[BundleFile]) -> Result<serde_json::Value, PolicyError> {
    let mut merged = serde_json::Map::new();
    let mut defined_in: BTreeMap<String, &str> = BTreeMap::new();
    for file in files.iter().filter(|file| file.kind == FileKind::Data) {
        let data_err = |message: String| PolicyError::Data {
            path: file.path.clone(),
            message,
        };
        // Parsed as YAML values first: unlike `serde_json::Value`, they refuse duplicate keys
        // instead of silently keeping the last one.
        let parsed: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&file.contents).map_err(|err| data_err(err.to_string()))?;
        let parsed = serde_json::to_value(parsed)
            .map_err(|err| data_err(format!("not JSON-like: {err}")))?;
        let mapping = match parsed {
            // A file holding only comments is an empty mapping.
            serde_json::Value::Null => serde_json::Map::new(),
            serde_json::Value::Object(mapping) => mapping,
            _ => return Err(data_err("the top level must be a mapping".to_string())),
        };
        crate::hosts::validate_data(&mapping).map_err(data_err)?;
        for (key, value) in mapping {
            if let Some(other) = defined_in.get(&key) {
                return Err(data_err(format!(
                    "top-level key `{key}` is already defined in {other}"
                )));
            }
            defined_in.insert(key.clone(), &file.rel);
            merged.insert(key, value);
        }
    }
    Ok(serde_json::Value::Object(merged))
}
