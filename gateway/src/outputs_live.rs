//! Collecting `/output` while the sandbox still lives (a session, after each execution).
//!
//! The program may still run (a background thread, a leftover process) and may swap anything
//! in `/output` at any moment, so nothing here resolves a path the program could have changed:
//! the walk holds a file descriptor per directory and opens each entry by its single name
//! relative to it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)` and
//! `O_NOFOLLOW`. A symlink (or a directory swapped for one) fails to open (`symlink`), so
//! nothing outside `/output` is ever read; what the descriptor then names is checked with
//! `fstat`: a regular file with more than one link is skipped (`hardlink`: it could not point
//! out of the tmpfs anyway, but its other name is not the program's to hand over), anything
//! else that is not a file or a directory is skipped (`special_file`). A file that vanishes or
//! changes type between the listing and the open is skipped (`changed`). Content may still
//! change while it is copied: what is collected is what was read, within the output limit.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, SFlag};
use sha2::{Digest, Sha256};

use crate::outputs::{
    check_component, Collected, OutputFile, Skipped, COPY_CHUNK, MAX_DEPTH, MAX_ENTRIES,
    MAX_PATH_BYTES,
};

/// A descriptor closed when dropped.
struct Fd(RawFd);

impl Drop for Fd {
    fn drop(&mut self) {
        let _ = nix::unistd::close(self.0);
    }
}

/// Opens `name` in `dir` without following or crossing anything.
fn open_beneath(dir: RawFd, name: &str) -> nix::Result<Fd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    openat2(dir, name, how).map(Fd)
}

/// The names in a directory, sorted (`.` and `..` left out).
fn names(dir: &Fd) -> io::Result<Vec<Vec<u8>>> {
    let copy = nix::unistd::dup(dir.0)?;
    let mut listing = nix::dir::Dir::from_fd(copy)?;
    let mut names: Vec<Vec<u8>> = listing
        .iter()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_bytes().to_vec())
        .filter(|name| name != b"." && name != b"..")
        .collect();
    names.sort();
    Ok(names)
}

/// Copies what is in `src` (a live sandbox's output area) into `dest`, at most `budget` bytes.
pub fn collect_live(src: &Path, dest: &Path, budget: u64) -> io::Result<Collected> {
    let root = Fd(nix::fcntl::open(
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?);
    let mut out = Collected::default();
    let mut left = budget;
    let mut seen = 0usize;
    let mut stack = vec![(root, String::new(), 0usize)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        let mut subdirs = Vec::new();
        for raw in names(&dir)? {
            seen += 1;
            let shown = String::from_utf8_lossy(&raw).into_owned();
            let rel = if rel_dir.is_empty() {
                shown.clone()
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
                return Ok(out);
            }
            let name_ok = check_component(&shown).is_ok()
                && std::str::from_utf8(&raw).is_ok()
                && rel.len() <= MAX_PATH_BYTES;
            if !name_ok {
                out.skipped.push(skip("bad_name", None));
                continue;
            }
            let entry = match open_beneath(dir.0, shown.as_str()) {
                Ok(entry) => entry,
                Err(Errno::ELOOP | Errno::EXDEV) => {
                    out.skipped.push(skip("symlink", None));
                    continue;
                }
                Err(_) => {
                    out.skipped.push(skip("changed", None));
                    continue;
                }
            };
            let stat = fstat(entry.0)?;
            let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
            let size = u64::try_from(stat.st_size).unwrap_or(0);
            if kind == SFlag::S_IFDIR {
                if depth + 1 >= MAX_DEPTH {
                    out.skipped.push(skip("too_deep", None));
                } else {
                    subdirs.push((entry, rel.clone(), depth + 1));
                }
            } else if kind != SFlag::S_IFREG {
                out.skipped.push(skip("special_file", None));
            } else if stat.st_nlink > 1 {
                out.skipped.push(skip("hardlink", Some(size)));
            } else if size > left {
                out.truncated = true;
                out.skipped.push(skip("output_limit", Some(size)));
            } else {
                let file = copy(&entry, &dest.join(&rel), left)?;
                left -= file.bytes;
                out.files.push(OutputFile { path: rel, ..file });
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    out.files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Copies at most `at_most` bytes from an open file, hashing them.
fn copy(source: &Fd, dest: &Path, at_most: u64) -> io::Result<OutputFile> {
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
    let mut buf = vec![0u8; COPY_CHUNK];
    while bytes < at_most {
        let want = usize::try_from(at_most - bytes)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = match nix::unistd::read(source.0, &mut buf[..want]) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(err) => return Err(err.into()),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_hardlinks_and_specials_are_not_collected() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        fs::write(src.path().join("a.txt"), "hi").unwrap();
        fs::create_dir(src.path().join("sub")).unwrap();
        fs::write(src.path().join("sub/b"), "b").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("pw")).unwrap();
        std::os::unix::fs::symlink("/etc", src.path().join("etc")).unwrap();
        fs::write(src.path().join("h1"), "x").unwrap();
        fs::hard_link(src.path().join("h1"), src.path().join("h2")).unwrap();
        let got = collect_live(src.path(), &dest.path().join("out"), 1024).unwrap();
        let files: Vec<_> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(files, ["a.txt", "sub/b"]);
        let skipped: Vec<_> = got
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            [
                ("etc", "symlink"),
                ("h1", "hardlink"),
                ("h2", "hardlink"),
                ("pw", "symlink")
            ]
        );
        assert_eq!(fs::read(dest.path().join("out/a.txt")).unwrap(), b"hi");
    }
}
