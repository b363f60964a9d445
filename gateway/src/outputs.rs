//! Files a program leaves in `/output`.
//!
//! Each execution gets its own size-capped tmpfs on the host (`<data_dir>/scratch/<id>`),
//! bind-mounted at `/output`: it outlives the container, so the files can be collected after the
//! sandbox has gone and nothing can change them any more. Collection copies regular files into
//! `<data_dir>/outputs/<id>/` with a manifest (path, bytes, sha256). It never follows a
//! symlink, reads nothing but regular files, never writes to the source, and stops at the
//! execution's output limit; what it did not collect is listed with the reason. A hardlink
//! cannot point out of `/output`: the tmpfs is a file system of its own.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most entries (files, directories, anything) one collection looks at.
pub const MAX_ENTRIES: usize = 1000;
/// Deepest directory nesting collected.
pub(crate) const MAX_DEPTH: usize = 32;
/// Longest relative path collected, in bytes.
pub(crate) const MAX_PATH_BYTES: usize = 1024;
pub(crate) const COPY_CHUNK: usize = 64 * 1024;

/// One collected file and something not collected: the API's wire types (`outputs`,
/// `outputs_skipped` of a record).
pub use api_types::{OutputFile, SkippedOutput as Skipped};

/// The manifest of one collection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collected {
    pub files: Vec<OutputFile>,
    pub skipped: Vec<Skipped>,
    /// The output limit (bytes or entries) stopped collection.
    pub truncated: bool,
}

/// A per-execution tmpfs on the host, mounted at `/output` inside the sandbox. Unmounted and
/// removed by [`OutputArea::remove`] (or, after a crash, by [`sweep`]).
#[derive(Debug)]
pub struct OutputArea {
    dir: PathBuf,
    removed: bool,
}

impl OutputArea {
    /// Mounts a tmpfs of `size_mb` at `<scratch>/<id>`, writable by the sandbox user only
    /// through the sticky, world-writable root of that tmpfs (the scratch directory itself is
    /// root's alone). Needs CAP_SYS_ADMIN: sandgate runs as root.
    pub fn create(scratch: &Path, id: &str, size_mb: u64) -> io::Result<OutputArea> {
        check_component(id)?;
        fs::create_dir_all(scratch)?;
        fs::set_permissions(scratch, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let dir = scratch.join(id);
        fs::create_dir(&dir)?;
        let options = format!("size={}m,mode=1777,nr_inodes=16384", size_mb.max(1));
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        if let Err(errno) = mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            flags,
            Some(options.as_str()),
        ) {
            let _ = fs::remove_dir(&dir);
            return Err(io::Error::other(format!(
                "mounting the /output tmpfs at {} failed: {errno} (sandgate needs root to mount it)",
                dir.display()
            )));
        }
        Ok(OutputArea {
            dir,
            removed: false,
        })
    }

    /// The host directory to bind-mount at `/output`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Copies what the program left into `dest` (created), at most `budget` bytes of files.
    /// Only call it once nothing of the program runs any more (the sandbox stopped, or its init
    /// reported every other process gone: see `runtime::Ran::settled`).
    pub fn collect(&self, dest: &Path, budget: u64) -> io::Result<Collected> {
        collect(&self.dir, dest, budget)
    }

    /// Unmounts the tmpfs (its contents vanish) and removes the mount point.
    pub fn remove(mut self) -> io::Result<()> {
        self.removed = true;
        unmount_and_remove(&self.dir)
    }
}

impl Drop for OutputArea {
    fn drop(&mut self) {
        if !self.removed {
            if let Err(err) = unmount_and_remove(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), error = %err, "output area left behind for the sweep");
            }
        }
    }
}

fn unmount_and_remove(dir: &Path) -> io::Result<()> {
    match umount2(dir, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(errno) => return Err(io::Error::from(errno)),
    }
    match fs::remove_dir(dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Removes output areas whose execution is no longer live (left by a crash or a kill -9). The
/// directory is listed before `is_live` is asked, so an area created meanwhile is never seen,
/// and one whose execution is live is never touched.
pub fn sweep(scratch: &Path, is_live: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = fs::read_dir(scratch) else {
        return 0;
    };
    let names: Vec<_> = entries.flatten().map(|entry| entry.file_name()).collect();
    let mut removed = 0;
    for name in names {
        let id = name.to_string_lossy();
        if is_live(&id) {
            continue;
        }
        let dir = scratch.join(&name);
        match unmount_and_remove(&dir) {
            Ok(()) => removed += 1,
            Err(err) => {
                tracing::warn!(dir = %dir.display(), error = %err, "could not remove a stale output area");
            }
        }
    }
    removed
}

/// Walks `src` depth-first in name order and copies regular files into `dest`.
pub fn collect(src: &Path, dest: &Path, budget: u64) -> io::Result<Collected> {
    let mut out = Collected::default();
    let mut left = budget;
    let mut seen = 0usize;
    fs::create_dir_all(dest)?;
    // (directory on the host, its relative path, depth)
    let mut stack = vec![(src.to_owned(), String::new(), 0usize)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(fs::DirEntry::file_name);
        let mut subdirs = Vec::new();
        for entry in entries {
            seen += 1;
            let raw_name = entry.file_name();
            let shown = raw_name.to_string_lossy();
            let rel = if rel_dir.is_empty() {
                shown.clone().into_owned()
            } else {
                format!("{rel_dir}/{shown}")
            };
            let skip = |reason: &str, bytes: Option<u64>| Skipped {
                path: rel.clone(),
                bytes,
                reason: reason.to_owned(),
            };
            if seen > MAX_ENTRIES {
                out.truncated = true;
                out.skipped.push(skip("too_many_entries", None));
                return Ok(finish(out));
            }
            // symlink_metadata: a symlink is reported as one, never followed.
            let meta = entry.path().symlink_metadata()?;
            let name_ok = raw_name
                .to_str()
                .is_some_and(|name| check_component(name).is_ok())
                && rel.len() <= MAX_PATH_BYTES;
            if meta.file_type().is_symlink() {
                out.skipped.push(skip("symlink", None));
            } else if !name_ok {
                out.skipped.push(skip("bad_name", None));
            } else if meta.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    out.skipped.push(skip("too_deep", None));
                } else {
                    subdirs.push((entry.path(), rel.clone(), depth + 1));
                }
            } else if !meta.is_file() {
                out.skipped.push(skip("special_file", None));
            } else if meta.size() > left {
                out.truncated = true;
                out.skipped.push(skip("output_limit", Some(meta.size())));
            } else {
                let file = copy_file(&entry.path(), &dest.join(&rel), left)?;
                left -= file.bytes;
                out.files.push(OutputFile {
                    path: rel.clone(),
                    ..file
                });
            }
        }
        // Reverse so that the stack pops them in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(finish(out))
}

/// Lists what sandbox-init reported as special files in `/output` (FIFOs, sockets, devices:
/// under gVisor they live in the sandbox's memory and never reach the host's output area) as
/// skipped `special_file`, unless the collection already lists that path.
pub fn add_special_files(out: &mut Collected, paths: &[String]) {
    for path in paths {
        let listed = out.skipped.iter().any(|skipped| &skipped.path == path)
            || out.files.iter().any(|file| &file.path == path);
        if !listed {
            out.skipped.push(Skipped {
                path: path.clone(),
                bytes: None,
                reason: "special_file".to_owned(),
            });
        }
    }
}

fn finish(mut out: Collected) -> Collected {
    out.files.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Copies one regular file (opened without following a symlink, read-only), hashing it.
fn copy_file(src: &Path, dest: &Path, at_most: u64) -> io::Result<OutputFile> {
    let source = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(src)?;
    if !source.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{} changed type during collection",
            src.display()
        )));
    }
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut target = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)?;
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    let mut reader = source.take(at_most);
    let mut buf = vec![0u8; COPY_CHUNK];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        target.write_all(&buf[..n])?;
        bytes += n as u64;
    }
    target.sync_all()?;
    Ok(OutputFile {
        path: String::new(),
        bytes,
        sha256: hex::encode(hash.finalize()),
    })
}

/// A name that may be one path component of an output: not empty, not `.`/`..`, no `/`, no
/// control characters, at most 255 bytes.
pub(crate) fn check_component(name: &str) -> io::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ))
    }
}

/// Opens a collected file for download: `path` must be one the manifest lists (the caller
/// checks), and is opened without following symlinks at any level we did not create.
pub fn open_collected(outputs_dir: &Path, path: &str) -> io::Result<File> {
    if path.split('/').any(|part| check_component(part).is_err()) {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no such output"));
    }
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(outputs_dir.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn collects_regular_files_and_lists_the_rest() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("secret"), b"host secret");
        write(&src.path().join("a.txt"), b"hello");
        write(&src.path().join("sub/b.bin"), &[7u8; 100]);
        std::os::unix::fs::symlink(outside.path().join("secret"), src.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), src.path().join("dirlink")).unwrap();
        nix::unistd::mkfifo(&src.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let before = fs::metadata(src.path().join("a.txt"))
            .unwrap()
            .modified()
            .unwrap();

        let got = collect(src.path(), dest.path(), 1 << 20).unwrap();
        let paths: Vec<_> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", "sub/b.bin"]);
        assert_eq!(
            got.files[0].sha256,
            hex::encode(Sha256::digest(b"hello")),
            "sha256 of the copied bytes"
        );
        let reasons: Vec<_> = got
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                ("dirlink", "symlink"),
                ("fifo", "special_file"),
                ("link", "symlink")
            ]
        );
        assert!(!got.truncated);
        assert_eq!(fs::read(dest.path().join("sub/b.bin")).unwrap(), [7u8; 100]);
        assert!(!dest.path().join("link").exists());
        assert!(!dest.path().join("dirlink").exists());
        // The originals are untouched.
        assert_eq!(fs::read(src.path().join("a.txt")).unwrap(), b"hello");
        assert_eq!(
            fs::metadata(src.path().join("a.txt"))
                .unwrap()
                .modified()
                .unwrap(),
            before
        );
    }

    #[test]
    fn special_files_reported_by_the_init_are_listed_once() {
        let mut out = Collected {
            skipped: vec![Skipped {
                path: "seen".into(),
                bytes: None,
                reason: "special_file".into(),
            }],
            ..Collected::default()
        };
        add_special_files(&mut out, &["seen".into(), "sub/fifo".into()]);
        let listed: Vec<_> = out
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            listed,
            [("seen", "special_file"), ("sub/fifo", "special_file")]
        );
    }

    #[test]
    fn stops_at_the_budget_and_says_so() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        write(&src.path().join("1-small"), &[1u8; 10]);
        write(&src.path().join("2-big"), &[2u8; 1000]);
        write(&src.path().join("3-small"), &[3u8; 10]);
        let got = collect(src.path(), dest.path(), 100).unwrap();
        let paths: Vec<_> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["1-small", "3-small"]);
        assert!(got.truncated);
        assert_eq!(
            got.skipped,
            [Skipped {
                path: "2-big".into(),
                bytes: Some(1000),
                reason: "output_limit".into()
            }]
        );
        assert!(!dest.path().join("2-big").exists());
    }

    #[test]
    fn bounds_entries_and_names() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        for i in 0..(MAX_ENTRIES + 5) {
            write(&src.path().join(format!("f{i:05}")), b"x");
        }
        write(&src.path().join("bad\nname"), b"x");
        let got = collect(src.path(), dest.path(), 1 << 20).unwrap();
        assert!(got.truncated);
        assert!(got.files.len() < MAX_ENTRIES);
        assert!(got.skipped.iter().any(|s| s.reason == "bad_name"));
        assert_eq!(got.skipped.last().unwrap().reason, "too_many_entries");
    }

    #[test]
    fn open_collected_refuses_traversal() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "a/../../b", "/etc/passwd", "", "a//b"] {
            assert!(open_collected(dir.path(), bad).is_err(), "{bad:?}");
        }
    }
}
