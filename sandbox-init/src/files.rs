//! Creating the job's files, before anything untrusted runs.
//!
//! Paths arrive validated by [`crate::spec::validate_file_path`]. What is checked here is the
//! file system: no symlink is followed, neither as the file itself (`O_CREAT|O_EXCL|O_NOFOLLOW`)
//! nor as a parent directory (each parent is inspected with `lstat`). The check-then-create is
//! race-free only because nothing else runs in the sandbox yet: keep it before the spawn.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

use crate::spec::JobFile;

/// Permission bits of every directory the init creates.
pub const DIR_MODE: u32 = 0o755;

#[derive(Debug, Error)]
pub enum FileError {
    #[error("inspecting {}: {err}", .path.display())]
    Inspect { path: PathBuf, err: io::Error },
    #[error("{} exists and is not a directory (symlinks are not followed)", .path.display())]
    NotADirectory { path: PathBuf },
    #[error("creating directory {}: {err}", .path.display())]
    CreateDir { path: PathBuf, err: io::Error },
    #[error("creating file {}: {err}", .path.display())]
    Create { path: PathBuf, err: io::Error },
    #[error("writing file {}: {err}", .path.display())]
    Write { path: PathBuf, err: io::Error },
}

/// Writes every file in order; stops at the first failure.
pub fn write_files(files: &[JobFile]) -> Result<(), FileError> {
    files
        .iter()
        .try_for_each(|file| write_file(&file.path, &file.content, file.mode))
}

/// Creates `path` (which must not exist) with exactly `mode`, creating missing parents with
/// [`DIR_MODE`]. Refuses to follow a symlink anywhere on the way.
pub fn write_file(path: &Path, content: &[u8], mode: u32) -> Result<(), FileError> {
    if let Some(parent) = path.parent() {
        create_parents(parent)?;
    }
    let create_err = |err| FileError::Create {
        path: path.to_owned(),
        err,
    };
    let write_err = |err| FileError::Write {
        path: path.to_owned(),
        err,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(create_err)?;
    file.write_all(content).map_err(write_err)?;
    // fchmod, not the open mode: the umask must not change what the spec asked for.
    file.set_permissions(Permissions::from_mode(mode))
        .map_err(write_err)
}

fn create_parents(dir: &Path) -> Result<(), FileError> {
    let mut current = PathBuf::new();
    for component in dir.components() {
        current.push(component);
        if component == Component::RootDir {
            continue;
        }
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(FileError::NotADirectory { path: current }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => create_dir(&current)?,
            Err(err) => return Err(FileError::Inspect { path: current, err }),
        }
    }
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), FileError> {
    let err = |err| FileError::CreateDir {
        path: path.to_owned(),
        err,
    };
    DirBuilder::new().mode(DIR_MODE).create(path).map_err(err)?;
    fs::set_permissions(path, Permissions::from_mode(DIR_MODE)).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn creates_parents_and_applies_the_exact_mode() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("a/b/run.sh");
        write_file(&path, b"echo hi\n", 0o755).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"echo hi\n");
        assert_eq!(mode_of(&path), 0o755);
        assert_eq!(mode_of(&root.path().join("a")), DIR_MODE);
        assert_eq!(mode_of(&root.path().join("a/b")), DIR_MODE);

        let private = root.path().join("a/secret");
        write_file(&private, b"", 0o400).unwrap();
        assert_eq!(mode_of(&private), 0o400);
    }

    #[test]
    fn writes_several_files_into_one_directory() {
        let root = tempfile::tempdir().unwrap();
        let files: Vec<JobFile> = ["d/one", "d/two"]
            .iter()
            .map(|name| JobFile {
                path: root.path().join(name),
                content: name.as_bytes().to_vec(),
                mode: 0o644,
            })
            .collect();
        write_files(&files).unwrap();
        assert_eq!(fs::read(root.path().join("d/two")).unwrap(), b"d/two");
    }

    #[test]
    fn refuses_an_existing_file() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("f");
        write_file(&path, b"first", 0o644).unwrap();
        let err = write_file(&path, b"second", 0o644).unwrap_err();
        assert!(matches!(err, FileError::Create { .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"first");
    }

    #[test]
    fn refuses_a_symlink_as_the_file() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("target");
        fs::write(&target, b"keep").unwrap();
        let link = root.path().join("link");
        symlink(&target, &link).unwrap();
        let err = write_file(&link, b"overwrite", 0o644).unwrap_err();
        assert!(matches!(err, FileError::Create { .. }), "{err}");
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        // A dangling symlink must not be followed to create its target either.
        let dangling = root.path().join("dangling");
        symlink(root.path().join("nowhere"), &dangling).unwrap();
        assert!(write_file(&dangling, b"x", 0o644).is_err());
        assert!(!root.path().join("nowhere").exists());
    }

    #[test]
    fn refuses_a_symlink_as_a_parent_directory() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        symlink(elsewhere.path(), root.path().join("dir")).unwrap();
        let err = write_file(&root.path().join("dir/f"), b"x", 0o644).unwrap_err();
        assert!(matches!(err, FileError::NotADirectory { .. }), "{err}");
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    #[test]
    fn refuses_a_file_as_a_parent_directory() {
        let root = tempfile::tempdir().unwrap();
        write_file(&root.path().join("f"), b"", 0o644).unwrap();
        let err = write_file(&root.path().join("f/g"), b"", 0o644).unwrap_err();
        assert!(matches!(err, FileError::NotADirectory { .. }), "{err}");
    }
}
