//! A session's directory watchers (E2B's `filesystem.Filesystem` `WatchDir` / `CreateWatcher`):
//! like a process (`procs`), a watcher is started by the gateway with `docker exec --user
//! 65534:65534 <sandbox> /sandgate/init watch <tag> [recursive] -- <path>` ([`watch_argv`]), as
//! the program's user, never by the init.
//!
//! The watcher finds `<path>` as the init's file operations do (`files`: in one of the
//! writable places, each component opened without following a symlink), watches it with
//! inotify (a watch per directory when recursive, at most [`MAX_WATCH_DIRS`]), and writes one
//! JSON [`WatchLine`] per line on its stdout: [`WatchLine::Ready`] once watching, then events
//! as they happen. Its stdin carries requests, one a line: [`FLUSH_REQUEST`] makes it hand over
//! every event the kernel has queued so far, then say [`WatchLine::Flushed`] (so a caller
//! that changed a file before asking sees that change). The end of its stdin ends it.

use serde::{Deserialize, Serialize};

use crate::files::FileFailure;
use crate::procs::INIT_PATH;

/// First argument of a watcher.
pub const WATCH_MODE: &str = "watch";
/// The argument that makes a watcher recursive.
pub const RECURSIVE_ARG: &str = "recursive";
/// The request line (without its `\n`) asking the watcher for what the kernel queued.
pub const FLUSH_REQUEST: &str = "flush";
/// Most directories one watcher watches (its root and, recursive, those below).
pub const MAX_WATCH_DIRS: usize = 1024;
/// Longest line a watcher writes.
pub const MAX_WATCH_LINE: usize = 8 * 1024;

/// What happened to an entry (E2B's `EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One line of a watcher's stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "line", rename_all = "snake_case", deny_unknown_fields)]
pub enum WatchLine {
    /// Watching: events from here on are reported.
    Ready,
    /// An entry changed; `name` is its path relative to the watched directory.
    Event { name: String, kind: WatchKind },
    /// Events were lost (the kernel's queue overflowed, or a new directory was past
    /// [`MAX_WATCH_DIRS`]): said, never silent.
    Lost { why: String },
    /// Every event queued before the last [`FLUSH_REQUEST`] was written.
    Flushed,
    /// The watcher could not watch (before [`WatchLine::Ready`]) or stopped.
    Failed {
        failure: FileFailure,
        message: String,
    },
}

impl WatchLine {
    /// The line as the watcher writes it, `\n` included.
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// The command line of a watcher of `path`.
pub fn watch_argv(tag: &str, recursive: bool, path: &str) -> Vec<String> {
    let mut line = vec![INIT_PATH.to_owned(), WATCH_MODE.to_owned(), tag.to_owned()];
    if recursive {
        line.push(RECURSIVE_ARG.to_owned());
    }
    line.push("--".to_owned());
    line.push(path.to_owned());
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_tagged_json() {
        let line = WatchLine::Event {
            name: "a/b.txt".to_owned(),
            kind: WatchKind::Create,
        };
        let text = line.encode();
        assert_eq!(
            String::from_utf8(text.clone()).unwrap(),
            "{\"line\":\"event\",\"name\":\"a/b.txt\",\"kind\":\"create\"}\n"
        );
        let back: WatchLine = serde_json::from_slice(&text).unwrap();
        assert_eq!(back, line);
        assert_eq!(
            watch_argv("wt_1", true, "/tmp/x"),
            [
                "/sandgate/init",
                "watch",
                "wt_1",
                "recursive",
                "--",
                "/tmp/x"
            ]
        );
    }
}
