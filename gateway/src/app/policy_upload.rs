//! An uploaded candidate bundle (`POST /v1/policy/reload` with a gzip'd tar body, or
//! `sandgate policy reload --upload DIR`): unpacked without trusting a name into a fresh
//! directory of its own, then loaded like any candidate directory, and removed afterwards.
//!
//! Only regular files and directories are taken, each by a path of plain components (no `..`,
//! no absolute path, no name starting with `.`), created new (never over an existing file), and
//! within bounds on the upload, the entries and the unpacked bytes.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Largest upload (compressed).
pub const MAX_UPLOAD_BYTES: usize = 8 * 1024 * 1024;
/// Most entries, and unpacked bytes, one upload may hold.
const MAX_ENTRIES: usize = 2000;
const MAX_UNPACKED: u64 = 64 * 1024 * 1024;

/// Unpacks the gzip'd tar `bytes` into `into` (which must not exist yet).
pub fn unpack(bytes: &[u8], into: &Path) -> Result<(), String> {
    std::fs::create_dir_all(into).map_err(|err| format!("{}: {err}", into.display()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let entries = archive
        .entries()
        .map_err(|err| format!("not a gzip'd tar archive: {err}"))?;
    let mut unpacked = 0;
    for (index, entry) in entries.enumerate() {
        if index >= MAX_ENTRIES {
            return Err(format!("the archive holds more than {MAX_ENTRIES} entries"));
        }
        let entry = entry.map_err(|err| format!("not a gzip'd tar archive: {err}"))?;
        unpacked += take(entry, into)?;
        if unpacked > MAX_UNPACKED {
            return Err(format!(
                "the archive unpacks to more than {MAX_UNPACKED} bytes"
            ));
        }
    }
    Ok(())
}

/// Writes one entry under `into`; returns the bytes written.
fn take(mut entry: tar::Entry<'_, impl Read>, into: &Path) -> Result<u64, String> {
    let kind = entry.header().entry_type();
    let name = entry
        .path()
        .map_err(|err| format!("an entry name is unreadable: {err}"))?
        .into_owned();
    let Some(rel) = plain_relative(&name) else {
        return Err(format!(
            "entry {:?}: names must be relative, without `..` or names starting with `.`",
            name.display()
        ));
    };
    let target = into.join(&rel);
    match kind {
        tar::EntryType::Directory => {
            std::fs::create_dir_all(&target).map_err(|err| format!("{}: {err}", rel.display()))?;
            Ok(0)
        }
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|err| format!("{}: {err}", rel.display()))?;
            }
            let mut file = std::fs::File::create_new(&target)
                .map_err(|err| format!("{}: {err}", rel.display()))?;
            let mut limited = (&mut entry).take(MAX_UNPACKED + 1);
            std::io::copy(&mut limited, &mut file)
                .map_err(|err| format!("{}: {err}", rel.display()))
        }
        // Extended headers carry metadata of the next entry; the reader has applied them.
        tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => Ok(0),
        other => Err(format!(
            "entry {}: only regular files and directories are taken, not {other:?}",
            rel.display()
        )),
    }
}

/// `name` as plain components (a leading `./` dropped), or `None` when any component is `..`,
/// absolute, or starts with `.`. The archive's root itself (`./`) is the empty path.
pub(super) fn plain_relative(name: &Path) -> Option<PathBuf> {
    let mut rel = PathBuf::new();
    for component in name.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(part) if !part.to_string_lossy().starts_with('.') => rel.push(part),
            _ => return None,
        }
    }
    Some(rel)
}

/// Packs the directory `dir` as a gzip'd tar of its regular files and directories (names
/// starting with `.` left out, as the gateway would refuse them), for upload.
pub fn pack(dir: &Path) -> std::io::Result<Vec<u8>> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(encoder);
    pack_tree(&mut builder, dir, Path::new(""))?;
    builder.into_inner()?.finish()
}

fn pack_tree<W: std::io::Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let (path, rel) = (entry.path(), rel.join(&name));
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() && !entry.file_type()?.is_symlink() {
            builder.append_dir(&rel, &path)?;
            pack_tree(builder, &path, &rel)?;
        } else if meta.is_file() {
            builder.append_path_with_name(&path, &rel)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::plain_relative;
    use std::path::Path;

    #[test]
    fn only_plain_relative_names_pass() {
        assert_eq!(
            plain_relative(Path::new("./data/t.yaml")),
            Some("data/t.yaml".into())
        );
        assert_eq!(plain_relative(Path::new("./")), Some("".into()));
        for bad in [
            "../x.rego",
            "/etc/passwd",
            "data/../../x",
            ".git/config",
            "a/.hidden",
        ] {
            assert_eq!(plain_relative(Path::new(bad)), None, "{bad}");
        }
    }
}
