//! A session's directory watcher (`watch <tag> [recursive] -- PATH`, `sandbox_protocol`'s
//! `watch` module): E2B's `files.watch_dir`, started by `docker exec` as the program's user.
//!
//! The directory is opened as the init's file operations open one ([`crate::fileops`]: in a
//! writable place, no symlink on the way), and watched with inotify through that open
//! descriptor (`/proc/self/fd/<n>`), so what is watched is the very directory checked, whatever
//! the program renames meanwhile. Recursive: every directory below gets its own watch (inotify
//! watches one directory), found the same way, and so does each one created later, at most
//! [`MAX_WATCH_DIRS`] in all. Events are written as [`WatchLine`]s on stdout; requests come on
//! stdin ([`FLUSH_REQUEST`]); the end of stdin ends the watcher. Nothing is ever written.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use sandbox_protocol::{
    locate, valid_tag, FileFailure, WatchKind, WatchLine, FLUSH_REQUEST, MAX_WATCH_DIRS,
};
use thiserror::Error;

use crate::fileops::open_dir;

/// What the watcher asks the kernel for, on every directory.
const MASK: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_ONLYDIR);
/// Longest request line read from stdin.
const MAX_REQUEST: usize = 256;

#[derive(Debug, Error)]
pub enum WatchError {
    #[error("{0:?} is not a watcher tag (letters, digits, _)")]
    Tag(String),
    #[error("watch needs `[recursive] -- PATH`")]
    Args,
    #[error("inotify: {0}")]
    Inotify(Errno),
    #[error("waiting for events: {0}")]
    Poll(Errno),
    #[error("writing events: {0}")]
    Write(std::io::Error),
    #[error("reading requests: {0}")]
    Read(std::io::Error),
}

/// The arguments after `watch`: the tag, whether recursive, the path.
pub fn parse_watch(
    mut args: impl Iterator<Item = OsString>,
) -> Result<(String, bool, String), WatchError> {
    let tag = args
        .next()
        .map_or_else(String::new, |t| t.to_string_lossy().into_owned());
    if !valid_tag(&tag) {
        return Err(WatchError::Tag(tag));
    }
    let mut next = args.next();
    let recursive = next
        .as_ref()
        .is_some_and(|arg| arg == sandbox_protocol::RECURSIVE_ARG);
    if recursive {
        next = args.next();
    }
    if next.is_none_or(|dashes| dashes != "--") {
        return Err(WatchError::Args);
    }
    let path = args.next().ok_or(WatchError::Args)?;
    if args.next().is_some() {
        return Err(WatchError::Args);
    }
    Ok((tag, recursive, path.to_string_lossy().into_owned()))
}

/// The watches of one watcher: each watched directory's path below the root.
struct Watches {
    inotify: Inotify,
    /// The root's absolute path (normalised).
    root: String,
    below: HashMap<WatchDescriptor, String>,
    recursive: bool,
}

/// Watches `path` until stdin ends; the watcher's exit status (1: it could not watch, said
/// in a [`WatchLine::Failed`]).
pub fn watch(path: &str, recursive: bool) -> Result<u8, WatchError> {
    let root = match locate(path) {
        Ok(at) => at.path(),
        Err(failure) => return failed(failure, format!("{path} is not in a writable place")),
    };
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(WatchError::Inotify)?;
    let mut watches = Watches {
        inotify,
        root,
        below: HashMap::new(),
        recursive,
    };
    if let Err((failure, message)) = watches.add("") {
        return failed(failure, message);
    }
    say(&WatchLine::Ready)?;
    watches.serve()?;
    Ok(0)
}

fn failed(failure: FileFailure, message: String) -> Result<u8, WatchError> {
    say(&WatchLine::Failed { failure, message })?;
    Ok(1)
}

fn say(line: &WatchLine) -> Result<(), WatchError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&line.encode())
        .and_then(|()| stdout.flush())
        .map_err(WatchError::Write)
}

impl Watches {
    /// Watches the directory `rel` below the root (and, recursive, every one below it).
    fn add(&mut self, rel: &str) -> Result<(), (FileFailure, String)> {
        if self.below.len() >= MAX_WATCH_DIRS {
            return Err((
                FileFailure::TooLarge,
                format!("a watcher watches at most {MAX_WATCH_DIRS} directories"),
            ));
        }
        let path = joined(&self.root, rel);
        let dir = open_dir(&path)?;
        let wd = self
            .inotify
            .add_watch(format!("/proc/self/fd/{}", dir.as_raw_fd()).as_str(), MASK)
            .map_err(|errno| {
                (
                    FileFailure::Io,
                    format!("watching {path}: {}", errno.desc()),
                )
            })?;
        self.below.insert(wd, rel.to_owned());
        if !self.recursive {
            return Ok(());
        }
        let mut subdirs = Vec::new();
        let mut dir = dir;
        for entry in dir.iter().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_dir = entry.file_type() == Some(nix::dir::Type::Directory);
            if is_dir && name != "." && name != ".." {
                subdirs.push(joined(rel, &name));
            }
        }
        for sub in subdirs {
            match self.add(&sub) {
                // Gone or swapped for a symlink meanwhile: not watched, never followed.
                Err((FileFailure::NotFound | FileFailure::Symlink, _)) => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Reports events and answers requests until stdin ends.
    fn serve(&mut self) -> Result<(), WatchError> {
        let mut requests = Vec::new();
        let mut buffer = [0u8; MAX_REQUEST];
        loop {
            let (events_ready, stdin_ready) = {
                let stdin = std::io::stdin();
                let mut fds = [
                    PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN),
                    PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(errno) => return Err(WatchError::Poll(errno)),
                }
                let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if events_ready {
                self.report()?;
            }
            if stdin_ready {
                let read = std::io::stdin()
                    .read(&mut buffer)
                    .map_err(WatchError::Read)?;
                if read == 0 {
                    return Ok(());
                }
                requests.extend_from_slice(&buffer[..read]);
                self.answer(&mut requests)?;
            }
        }
    }

    /// Answers each whole request line; a flush reports what the kernel queued first.
    fn answer(&mut self, requests: &mut Vec<u8>) -> Result<(), WatchError> {
        while let Some(end) = requests.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = requests.drain(..=end).collect();
            if line.strip_suffix(b"\n") == Some(FLUSH_REQUEST.as_bytes()) {
                self.report()?;
                say(&WatchLine::Flushed)?;
            }
        }
        if requests.len() > MAX_REQUEST {
            requests.clear();
        }
        Ok(())
    }

    /// Reports every event queued now.
    fn report(&mut self) -> Result<(), WatchError> {
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(Errno::EAGAIN) => return Ok(()),
                Err(errno) => return Err(WatchError::Inotify(errno)),
            };
            for event in events {
                self.one(&event)?;
            }
        }
    }

    fn one(&mut self, event: &InotifyEvent) -> Result<(), WatchError> {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return say(&WatchLine::Lost {
                why: "the kernel's queue of events overflowed".to_owned(),
            });
        }
        if event.mask.contains(AddWatchFlags::IN_IGNORED) {
            self.below.remove(&event.wd);
            return Ok(());
        }
        let Some(rel) = self.below.get(&event.wd).cloned() else {
            return Ok(());
        };
        let name = event
            .name
            .as_ref()
            .map(|n| n.to_string_lossy().into_owned());
        let is_self = name.is_none();
        if is_self && !rel.is_empty() {
            // A directory below the root: its parent's watch tells of it.
            return Ok(());
        }
        let full = joined(&rel, name.as_deref().unwrap_or(""));
        let Some(kind) = kind_of(event.mask) else {
            return Ok(());
        };
        say(&WatchLine::Event {
            name: full.clone(),
            kind,
        })?;
        let new_dir = event.mask.contains(AddWatchFlags::IN_ISDIR) && kind == WatchKind::Create;
        if self.recursive && new_dir && !is_self {
            match self.add(&full) {
                Ok(()) | Err((FileFailure::NotFound | FileFailure::Symlink, _)) => {}
                Err((_, why)) => say(&WatchLine::Lost {
                    why: format!("{full} is not watched: {why}"),
                })?,
            }
        }
        Ok(())
    }
}

/// E2B's event type of an inotify mask (as envd's fsnotify maps them).
fn kind_of(mask: AddWatchFlags) -> Option<WatchKind> {
    let any = |flags: AddWatchFlags| mask.intersects(flags);
    if any(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
        Some(WatchKind::Create)
    } else if any(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_DELETE_SELF) {
        Some(WatchKind::Remove)
    } else if any(AddWatchFlags::IN_MOVED_FROM | AddWatchFlags::IN_MOVE_SELF) {
        Some(WatchKind::Rename)
    } else if any(AddWatchFlags::IN_MODIFY) {
        Some(WatchKind::Write)
    } else if any(AddWatchFlags::IN_ATTRIB) {
        Some(WatchKind::Chmod)
    } else {
        None
    }
}

fn joined(base: &str, name: &str) -> String {
    match (base.is_empty(), name.is_empty()) {
        (_, true) => base.to_owned(),
        (true, false) => name.to_owned(),
        (false, false) => format!("{base}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os<'a>(list: &'a [&'a str]) -> impl Iterator<Item = OsString> + 'a {
        list.iter().map(OsString::from)
    }

    #[test]
    fn arguments_are_checked() {
        let (tag, recursive, path) = parse_watch(os(&["wt_1", "recursive", "--", "/tmp"])).unwrap();
        assert_eq!(
            (tag.as_str(), recursive, path.as_str()),
            ("wt_1", true, "/tmp")
        );
        assert!(!parse_watch(os(&["wt_1", "--", "/tmp"])).unwrap().1);
        for bad in [
            &["wt_1", "/tmp"][..],
            &["a b", "--", "/tmp"],
            &["wt_1", "--"],
        ] {
            assert!(parse_watch(os(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn masks_map_to_e2b_s_types() {
        let kind = |m| kind_of(m);
        assert_eq!(kind(AddWatchFlags::IN_CREATE), Some(WatchKind::Create));
        assert_eq!(kind(AddWatchFlags::IN_MOVED_TO), Some(WatchKind::Create));
        assert_eq!(kind(AddWatchFlags::IN_MOVED_FROM), Some(WatchKind::Rename));
        assert_eq!(kind(AddWatchFlags::IN_MODIFY), Some(WatchKind::Write));
        assert_eq!(kind(AddWatchFlags::IN_DELETE), Some(WatchKind::Remove));
        assert_eq!(kind(AddWatchFlags::IN_ATTRIB), Some(WatchKind::Chmod));
        assert_eq!(joined("", "a"), "a");
        assert_eq!(joined("a", "b"), "a/b");
    }
}
