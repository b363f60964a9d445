//! Writing a sandbox's output files into the operator's `--output-dir`. The names come from a
//! sandbox, so nothing about them is trusted:
//! - a name is relative, made of plain components (no `..`, `.`, empty parts, control
//!   characters), and no component starts with `.` unless `--allow-dotfiles` (a planted
//!   `.git/config` or `.bashrc` must not land in a working tree);
//! - every directory on the way is checked to be a real directory, never a symlink, and is
//!   created (mode 0700 for new ones) only beneath the output directory;
//! - the file itself is created with `O_CREAT|O_EXCL|O_NOFOLLOW`: an existing file or symlink is
//!   never opened, followed or truncated. With `--force` an existing *regular* file is replaced
//!   by renaming a freshly created file over it (a symlink or directory is still refused).
//!
//! The residual risk (SECURITY.md): another local user who can write inside the output
//! directory could swap a checked directory for a symlink between the check and the create.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How careful to be about what is already in the directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct SaveOptions {
    /// Replace an existing regular file of the same name.
    pub force: bool,
    /// Write names with a component starting with `.`.
    pub allow_dotfiles: bool,
}

/// Why one output was not written; the message names what to do.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("not a plain relative name ({0})")]
    BadName(&'static str),
    #[error("a dot-file or dot-directory (pass --allow-dotfiles to write it)")]
    DotFile,
    #[error("{} is not a directory (a symlink or a file is in the way)", .0.display())]
    NotADirectory(PathBuf),
    #[error("{} already exists (pass --force to replace a regular file)", .0.display())]
    Exists(PathBuf),
    #[error("{} exists and is not a regular file; it is never replaced", .0.display())]
    NotRegular(PathBuf),
    #[error("{}: {err}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SaveError + '_ {
    move |err| SaveError::Io {
        path: path.to_owned(),
        err,
    }
}

/// The components of `name` if it may be written, or why not.
pub fn check_name(name: &str, options: SaveOptions) -> Result<Vec<&str>, SaveError> {
    if name.is_empty() || name.len() > 4096 {
        return Err(SaveError::BadName("empty or longer than 4096 bytes"));
    }
    if name.starts_with('/') {
        return Err(SaveError::BadName("absolute"));
    }
    if name.chars().any(char::is_control) {
        return Err(SaveError::BadName("control characters"));
    }
    let parts: Vec<&str> = name.split('/').collect();
    for part in &parts {
        match *part {
            "" => return Err(SaveError::BadName("an empty component")),
            "." | ".." => return Err(SaveError::BadName("a . or .. component")),
            _ if part.len() > 255 => return Err(SaveError::BadName("a component over 255 bytes")),
            _ if part.starts_with('.') && !options.allow_dotfiles => {
                return Err(SaveError::DotFile)
            }
            _ => {}
        }
    }
    Ok(parts)
}

/// Writes `bytes` as `name` under `dir` (see the module comment); returns the path written.
pub fn save(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    options: SaveOptions,
) -> Result<PathBuf, SaveError> {
    let parts = check_name(name, options)?;
    let (file, parents) = parts
        .split_last()
        .ok_or(SaveError::BadName("an empty component"))?;
    let mut at = dir.to_path_buf();
    for part in parents {
        at.push(part);
        match fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => return Err(SaveError::NotADirectory(at)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&at)
                    .map_err(io(&at))?;
            }
            Err(err) => return Err(SaveError::Io { path: at, err }),
        }
    }
    let target = at.join(file);
    match create_new(&target, bytes) {
        Ok(()) => Ok(target),
        Err(SaveError::Io { err, .. }) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            replace(&at, file, &target, bytes, options)
        }
        Err(err) => Err(err),
    }
}

/// Replaces an existing regular file (only with `--force`): a new file is created beside it
/// (O_EXCL) and renamed over it, so a link swapped in meanwhile is replaced, not followed.
fn replace(
    parent: &Path,
    file: &str,
    target: &Path,
    bytes: &[u8],
    options: SaveOptions,
) -> Result<PathBuf, SaveError> {
    let meta = fs::symlink_metadata(target).map_err(io(target))?;
    if !meta.file_type().is_file() {
        return Err(SaveError::NotRegular(target.to_owned()));
    }
    if !options.force {
        return Err(SaveError::Exists(target.to_owned()));
    }
    let temporary = parent.join(format!(".{file}.sandgate-{}", std::process::id()));
    create_new(&temporary, bytes)?;
    fs::rename(&temporary, target).map_err(|err| {
        let _ = fs::remove_file(&temporary);
        SaveError::Io {
            path: target.to_owned(),
            err,
        }
    })?;
    Ok(target.to_owned())
}

/// `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600 (the operator widens it if they want).
fn create_new(path: &Path, bytes: &[u8]) -> Result<(), SaveError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.write_all(bytes).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const PLAIN: SaveOptions = SaveOptions {
        force: false,
        allow_dotfiles: false,
    };

    #[test]
    fn names_from_a_sandbox_are_checked() {
        assert_eq!(check_name("a/b.png", PLAIN).unwrap(), ["a", "b.png"]);
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../x",
            "a//b",
            "./a",
            "a/.",
            "a\nb",
            "a\u{1b}[2J",
        ] {
            assert!(check_name(bad, PLAIN).is_err(), "{bad:?}");
        }
        for dot in [".bashrc", ".git/config", "a/.ssh/authorized_keys"] {
            assert!(
                matches!(check_name(dot, PLAIN), Err(SaveError::DotFile)),
                "{dot:?}"
            );
            let allowed = SaveOptions {
                allow_dotfiles: true,
                ..PLAIN
            };
            assert!(check_name(dot, allowed).is_ok(), "{dot:?}");
        }
    }

    #[test]
    fn new_files_and_directories_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let written = save(dir.path(), "plots/2024/trend.png", b"png", PLAIN).unwrap();
        assert_eq!(written, dir.path().join("plots/2024/trend.png"));
        assert_eq!(fs::read(&written).unwrap(), b"png");
    }

    #[test]
    fn an_existing_file_is_replaced_only_with_force() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("r.txt"), b"mine").unwrap();
        let err = save(dir.path(), "r.txt", b"theirs", PLAIN).unwrap_err();
        assert!(matches!(err, SaveError::Exists(_)), "{err}");
        assert_eq!(fs::read(dir.path().join("r.txt")).unwrap(), b"mine");
        let force = SaveOptions {
            force: true,
            ..PLAIN
        };
        save(dir.path(), "r.txt", b"theirs", force).unwrap();
        assert_eq!(fs::read(dir.path().join("r.txt")).unwrap(), b"theirs");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn symlinks_are_never_followed_even_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, b"untouched").unwrap();
        symlink(&victim, dir.path().join("link.txt")).unwrap();
        symlink(outside.path(), dir.path().join("sub")).unwrap();
        let force = SaveOptions {
            force: true,
            ..PLAIN
        };
        let err = save(dir.path(), "link.txt", b"x", force).unwrap_err();
        assert!(matches!(err, SaveError::NotRegular(_)), "{err}");
        let err = save(dir.path(), "sub/new.txt", b"x", force).unwrap_err();
        assert!(matches!(err, SaveError::NotADirectory(_)), "{err}");
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
        assert!(!outside.path().join("new.txt").exists());
    }

    #[test]
    fn a_file_in_the_way_of_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), "a", b"file", PLAIN).unwrap();
        let err = save(dir.path(), "a/b", b"x", PLAIN).unwrap_err();
        assert!(matches!(err, SaveError::NotADirectory(_)), "{err}");
    }
}
