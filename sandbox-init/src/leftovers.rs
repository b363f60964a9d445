//! What the program left in `/output` that only the sandbox can see.
//!
//! gVisor keeps a FIFO or a Unix socket made in a bind-mounted directory in the sandbox's own
//! memory (and devices cannot be made at all without `CAP_MKNOD`): the host's output area never
//! holds them, so the gateway's collection, which runs on the host, cannot list them. The init
//! lists them for it ([`special_files`]) once the program ended (cold and pooled sandboxes: in
//! the exit trailer's report) or when a session asks after a turn, and the gateway lists them in
//! `outputs_skipped` as `special_file`.
//!
//! The walk never follows a symlink (`lstat`, and a symlinked directory is not entered), looks
//! at most at [`MAX_ENTRIES`] entries [`MAX_DEPTH`] deep, and lists at most
//! [`sandbox_protocol::MAX_SPECIAL_FILES`]. Something left running by the program may change
//! `/output` during the walk: what is listed is then only as true as the program let it be, and
//! it only concerns the program's own record.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use sandbox_protocol::MAX_SPECIAL_FILES;

/// Where the output area is mounted in a sandbox.
pub const OUTPUT_DIR: &str = "/output";
/// Most entries one walk looks at (the gateway's collection has the same bound).
pub const MAX_ENTRIES: usize = 1000;
/// Deepest directory nesting walked.
pub const MAX_DEPTH: usize = 32;

/// The paths (relative to `root`, `/`-separated, non-UTF-8 bytes shown as U+FFFD) of FIFOs,
/// sockets and devices under `root`, sorted; nothing if `root` cannot be read.
pub fn special_files(root: &Path) -> Vec<String> {
    let mut found = walk(root);
    found.sort();
    found
}

fn walk(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut seen = 0usize;
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(root.to_owned(), String::new(), 0)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(fs::DirEntry::file_name);
        let mut subdirs = Vec::new();
        for entry in entries {
            seen += 1;
            if seen > MAX_ENTRIES || found.len() >= MAX_SPECIAL_FILES {
                return found;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if rel_dir.is_empty() {
                name
            } else {
                format!("{rel_dir}/{name}")
            };
            // DirEntry::file_type does not follow a symlink.
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if depth + 1 < MAX_DEPTH {
                    subdirs.push((entry.path(), rel, depth + 1));
                }
            } else if kind.is_fifo()
                || kind.is_socket()
                || kind.is_char_device()
                || kind.is_block_device()
            {
                found.push(rel);
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;

    #[test]
    fn lists_fifos_and_sockets_but_no_file_directory_or_symlink() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path();
        fs::write(path.join("a.txt"), "x").unwrap();
        fs::create_dir_all(path.join("sub/deeper")).unwrap();
        nix::unistd::mkfifo(&path.join("pipe"), Mode::S_IRWXU).unwrap();
        nix::unistd::mkfifo(&path.join("sub/deeper/pipe2"), Mode::S_IRWXU).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(path.join("sub/sock")).unwrap();
        std::os::unix::fs::symlink("/dev/null", path.join("null")).unwrap();
        std::os::unix::fs::symlink("/dev", path.join("devdir")).unwrap();
        assert_eq!(
            special_files(path),
            ["pipe", "sub/deeper/pipe2", "sub/sock"]
        );
        assert!(special_files(&path.join("missing")).is_empty());
    }

    #[test]
    fn the_listing_is_bounded() {
        let root = tempfile::tempdir().unwrap();
        for i in 0..(MAX_SPECIAL_FILES + 10) {
            nix::unistd::mkfifo(&root.path().join(format!("p{i:03}")), Mode::S_IRWXU).unwrap();
        }
        assert_eq!(special_files(root.path()).len(), MAX_SPECIAL_FILES);
    }
}
