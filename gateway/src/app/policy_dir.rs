//! Writing an applied proposal back into the configured policy directory, so a restart or a
//! SIGHUP loads the revision that was approved. Never a mixed bundle: the new directory is
//! built beside the old one (a copy of it with the proposal's files written over), loaded to
//! check that it reads as the applied revision (a directory edited by hand since, or holding
//! another revision than the proposal's base, is left alone), fsynced, and exchanged with the
//! old one in one `renameat2(RENAME_EXCHANGE)`; the old one is then removed. Blocking: callers
//! run it off the async threads, under the reload lock.
//!
//! The exchange needs the policy directory's parent to be writable and on the same file system
//! (the directory is not a mount point of its own); otherwise, or on a read-only mount, the
//! directory is left as it was and the error says why (the revision stays active and kept).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{renameat2, RenameFlags};

/// Most entries, and bytes, of a policy directory copied to be replaced.
const MAX_ENTRIES: usize = 10_000;
const MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Replaces `policy_dir` with a copy of itself in which `files` (relative paths) are written,
/// if that copy reads as `revision`.
pub fn replace(
    policy_dir: &Path,
    files: &[(String, Vec<u8>)],
    revision: &str,
) -> Result<(), String> {
    let (parent, name) = match (policy_dir.parent(), policy_dir.file_name()) {
        (Some(parent), Some(name)) => (parent, name.to_string_lossy()),
        _ => return Err(format!("{} has no parent directory", policy_dir.display())),
    };
    let staging = parent.join(format!(".{name}.sandgate-{}", uuid::Uuid::new_v4()));
    let result = stage(policy_dir, &staging, files, revision).and_then(|()| {
        renameat2(
            None,
            &staging,
            None,
            policy_dir,
            RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(|err| {
            format!(
                "cannot exchange {} with the new bundle atomically ({err}); the policy \
                     directory must be a directory in a writable parent on the same file system",
                policy_dir.display()
            )
        })?;
        sync_dir(parent)
    });
    // After the exchange `staging` holds the old bundle; before it, the unfinished new one.
    if let Err(err) = std::fs::remove_dir_all(&staging) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %staging.display(), error = %err, "cannot remove a policy directory's staging copy");
        }
    }
    result
}

/// The new bundle in `staging`: `policy_dir` copied, `files` written, checked, fsynced.
fn stage(
    policy_dir: &Path,
    staging: &Path,
    files: &[(String, Vec<u8>)],
    revision: &str,
) -> Result<(), String> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |err: std::io::Error| format!("{path}: {err}")
    };
    let mut budget = (MAX_ENTRIES, MAX_BYTES);
    copy_tree(policy_dir, staging, &mut budget)?;
    // Every target checked before any is written: none may lead through a link.
    let mut targets = Vec::with_capacity(files.len());
    for (rel, bytes) in files {
        targets.push((writable_target(staging, rel)?, bytes));
    }
    for (path, bytes) in targets {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        write_new(&path, bytes).map_err(io(&path))?;
    }
    let engine = policy_engine::PolicyEngine::load(staging).map_err(|err| {
        format!(
            "the patched policy directory does not load: {}",
            super::error_chain(&err)
        )
    })?;
    if engine.revision() != revision {
        return Err(format!(
            "the policy directory does not hold the proposal's base (patched, it reads as {}, \
             not {revision}: edited by hand, or another revision is active than the one it \
             holds); left as it is",
            engine.revision()
        ));
    }
    sync_tree(staging)
}

/// Where `rel` goes in `staging`, never through a symbolic link: a directory on the way that is
/// a link is refused (writing there would write wherever it points, outside the bundle); the
/// file itself, if a link, is removed from the staging copy so that a plain file replaces it
/// (the link's target is not touched).
fn writable_target(staging: &Path, rel: &str) -> Result<PathBuf, String> {
    let rel = super::policy_upload::plain_relative(Path::new(rel))
        .filter(|rel| !rel.as_os_str().is_empty())
        .ok_or_else(|| format!("odd file name {rel:?}"))?;
    let mut path = staging.to_owned();
    let mut parts = rel.components().peekable();
    while let Some(part) = parts.next() {
        path.push(part);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.file_type().is_symlink() {
            continue;
        }
        if parts.peek().is_some() {
            return Err(format!(
                "{} is a symbolic link in the policy directory: a proposal's file is not written                  through it; replace the link by a directory",
                rel.display()
            ));
        }
        std::fs::remove_file(&path).map_err(|err| format!("{}: {err}", path.display()))?;
    }
    Ok(path)
}

/// Writes a new file at `path`, not following a link there (there is none: see
/// [`writable_target`]; `O_NOFOLLOW` makes sure).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)
}

/// Copies a directory tree (regular files, directories with their modes, symbolic links as
/// links), within `budget` (entries, bytes).
fn copy_tree(from: &Path, to: &Path, budget: &mut (usize, u64)) -> Result<(), String> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |err: std::io::Error| format!("{path}: {err}")
    };
    let meta = std::fs::metadata(from).map_err(io(from))?;
    std::fs::create_dir(to).map_err(io(to))?;
    std::fs::set_permissions(
        to,
        std::fs::Permissions::from_mode(meta.permissions().mode()),
    )
    .map_err(io(to))?;
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        budget.0 = budget
            .0
            .checked_sub(1)
            .ok_or_else(|| format!("{} holds more than {MAX_ENTRIES} entries", from.display()))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(io(&source))?;
        if kind.is_dir() {
            copy_tree(&source, &target, budget)?;
        } else if kind.is_symlink() {
            let link = std::fs::read_link(&source).map_err(io(&source))?;
            std::os::unix::fs::symlink(link, &target).map_err(io(&target))?;
        } else if kind.is_file() {
            let bytes = std::fs::copy(&source, &target).map_err(io(&source))?;
            budget.1 = budget
                .1
                .checked_sub(bytes)
                .ok_or_else(|| format!("{} holds more than {MAX_BYTES} bytes", from.display()))?;
        }
    }
    Ok(())
}

/// Removes the staging copies of `policy_dir` (`.<name>.sandgate-<uuid>` beside it) a process
/// that stopped abruptly during [`replace`] left. Called at start-up. Returns how many went.
pub fn sweep(policy_dir: &Path) -> usize {
    let (Some(parent), Some(name)) = (policy_dir.parent(), policy_dir.file_name()) else {
        return 0;
    };
    let prefix = format!(".{}.sandgate-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let left = entries.flatten().filter(|entry| {
        let name = entry.file_name();
        name.to_str().is_some_and(|name| name.starts_with(&prefix))
            && entry.file_type().is_ok_and(|kind| kind.is_dir())
    });
    left.filter(|entry| std::fs::remove_dir_all(entry.path()).is_ok())
        .count()
}

/// fsyncs every regular file and directory of a tree (not following links).
fn sync_tree(dir: &Path) -> Result<(), String> {
    let mut pending: Vec<PathBuf> = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|err| format!("{}: {err}", dir.display()))? {
            let entry = entry.map_err(|err| format!("{}: {err}", dir.display()))?;
            let kind = entry
                .file_type()
                .map_err(|err| format!("{}: {err}", dir.display()))?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                let path = entry.path();
                std::fs::File::open(&path)
                    .and_then(|file| file.sync_all())
                    .map_err(|err| format!("{}: {err}", path.display()))?;
            }
        }
        sync_dir(&dir)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir)
        .and_then(|file| file.sync_all())
        .map_err(|err| format!("{}: {err}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
    }

    fn copy_of_shipped(root: &Path) -> PathBuf {
        let dir = root.join("policies");
        copy_tree(&shipped(), &dir, &mut (MAX_ENTRIES, MAX_BYTES)).unwrap();
        dir
    }

    #[test]
    fn the_directory_is_exchanged_whole_or_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let dir = copy_of_shipped(root.path());
        let base = policy_engine::PolicyEngine::load(&dir).unwrap();
        let tenants = dir.join("data/tenants.yaml");
        let mut text = std::fs::read_to_string(&tenants).unwrap();
        text.push_str("\n# a change\n");
        let files = vec![("data/tenants.yaml".to_owned(), text.clone().into_bytes())];
        // The wrong revision: nothing changes, no staging copy is left.
        let refused = replace(&dir, &files, base.revision());
        assert!(refused.unwrap_err().contains("does not hold"));
        assert_ne!(std::fs::read_to_string(&tenants).unwrap(), text);
        let entries = || std::fs::read_dir(root.path()).unwrap().count();
        assert_eq!(entries(), 1);
        // The right one: the whole directory is the new bundle, extra files kept.
        let staged = root.path().join("expected");
        copy_tree(&dir, &staged, &mut (MAX_ENTRIES, MAX_BYTES)).unwrap();
        std::fs::write(staged.join("data/tenants.yaml"), &text).unwrap();
        let wanted = policy_engine::PolicyEngine::load(&staged).unwrap();
        std::fs::remove_dir_all(&staged).unwrap();
        replace(&dir, &files, wanted.revision()).unwrap();
        assert_eq!(std::fs::read_to_string(&tenants).unwrap(), text);
        assert!(dir.join("README.md").is_file());
        assert_eq!(entries(), 1);
    }

    /// A data file that is a link is replaced by a plain file in the new bundle and what it
    /// pointed to is left alone; a linked directory on the way is refused before anything is
    /// written.
    #[test]
    fn no_file_is_written_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let dir = copy_of_shipped(root.path());
        let tenants = dir.join("data/tenants.yaml");
        let outside = root.path().join("outside.yaml");
        std::fs::rename(&tenants, &outside).unwrap();
        std::os::unix::fs::symlink(&outside, &tenants).unwrap();
        let before = std::fs::read_to_string(&outside).unwrap();
        let text = format!("{before}\n# a change\n");
        let files = vec![("data/tenants.yaml".to_owned(), text.clone().into_bytes())];
        let staged = root.path().join("expected");
        copy_tree(&dir, &staged, &mut (MAX_ENTRIES, MAX_BYTES)).unwrap();
        std::fs::remove_file(staged.join("data/tenants.yaml")).unwrap();
        std::fs::write(staged.join("data/tenants.yaml"), &text).unwrap();
        let wanted = policy_engine::PolicyEngine::load(&staged).unwrap();
        std::fs::remove_dir_all(&staged).unwrap();

        // A wrong revision: refused, and the link's target untouched (the old code wrote
        // through the link before it checked the revision).
        let refused = replace(&dir, &files, "sha256:0000");
        assert!(refused.unwrap_err().contains("does not hold"));
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), before);
        // The right one: the new bundle holds a plain file; the target is untouched.
        replace(&dir, &files, wanted.revision()).unwrap();
        assert!(!std::fs::symlink_metadata(&tenants)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&tenants).unwrap(), text);
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), before);

        // A linked directory on the way: refused, nothing written.
        let data = dir.join("data");
        let elsewhere = root.path().join("elsewhere");
        std::fs::rename(&data, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &data).unwrap();
        let kept = std::fs::read_to_string(elsewhere.join("tenants.yaml")).unwrap();
        let refused = replace(&dir, &files, wanted.revision()).unwrap_err();
        assert!(refused.contains("symbolic link"), "{refused}");
        assert_eq!(
            std::fs::read_to_string(elsewhere.join("tenants.yaml")).unwrap(),
            kept
        );
    }
}
