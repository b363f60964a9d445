//! File operations on a session's sandbox, carried by the session's own stdin (no second
//! channel). A [`FileLine`] (a JSON object with a `file` key, which no [`crate::Job`] has) is
//! not a turn: the init performs the operation itself
//! (never through the runner or anything the program could have changed) and answers at once
//! on stderr with [`file_answer`] for the line's `exit_nonce`:
//! `\0sandgate-file:<nonce>:<FileAnswer as compact JSON>\n` (compact JSON holds no newline and
//! no NUL). The gateway takes it out of the stream with [`FileAnswerTaker`]; the program never
//! sees the nonce, so it cannot forge an answer.
//!
//! Paths are absolute and lie in one of [`FILE_PLACES`] (the sandbox's writable places). The
//! init resolves them component by component from that place (`openat` with `O_NOFOLLOW`):
//! a symlink anywhere on the way, or as the file read or written, is refused; a `stat` or a
//! listing shows a symlink as one (with its target) without following it. Limits:
//! [`MAX_FILE_BYTES`] per read or write, [`MAX_LIST_ENTRIES`] per listing (then `truncated`),
//! [`MAX_LIST_DEPTH`] levels.

use serde::{Deserialize, Serialize};

/// A file operation line on a session's stdin: the operation and the secret its answer
/// carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLine {
    pub file: FileRequest,
    pub exit_nonce: String,
}
/// Starts a file operation's answer on stderr.
pub const FILE_ANSWER_PREFIX: &[u8] = b"\0sandgate-file:";
/// The places file operations may touch: the sandbox's writable places (`/home/user` where
/// the image has it).
pub const FILE_PLACES: [&str; 4] = ["/workspace", "/tmp", "/output", "/home/user"];
/// Largest file read or written in one operation, in bytes.
pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;
/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Deepest listing (1: the directory's own entries).
pub const MAX_LIST_DEPTH: u32 = 16;
/// Longest path accepted, in bytes (Linux `PATH_MAX` less the NUL).
pub const MAX_PATH_BYTES: usize = 4095;
/// Longest path component accepted, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// Longest answer line after the nonce (a read's base64 plus its entry, or a full listing).
pub const MAX_ANSWER_BYTES: usize = MAX_FILE_BYTES.div_ceil(3) * 4 + 8 * 1024 * 1024;

/// One file operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileRequest {
    /// The file's bytes.
    Read {
        path: String,
    },
    /// Creates or replaces a regular file (parents must exist). `mode`: permission bits,
    /// absent `0o644` for a new file, unchanged for an existing one.
    Write {
        path: String,
        content_b64: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    Stat {
        path: String,
    },
    /// The entries under a directory, `depth` levels down (at least 1).
    List {
        path: String,
        depth: u32,
    },
    /// Creates the directory and its missing parents; an existing directory is not an error.
    Mkdir {
        path: String,
    },
    /// Moves or renames within one place (each place is a file system of its own: a move
    /// between two is refused as `invalid`); an existing destination file is replaced.
    Rename {
        from: String,
        to: String,
    },
    /// Removes a file, a symlink (not its target) or a directory with everything under it.
    Remove {
        path: String,
    },
}

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry, as `lstat` sees it (a symlink is never followed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Last modification, Unix time in nanoseconds.
    pub mtime_ns: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// Why an operation was refused or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFailure {
    /// The path is not absolute, not canonical, or outside [`FILE_PLACES`].
    Outside,
    /// A symlink on the way or as the file itself.
    Symlink,
    NotFound,
    NotADirectory,
    IsADirectory,
    /// Not a regular file (a FIFO, socket or device).
    NotAFile,
    /// The destination exists as a directory (rename), or a file is in the way (mkdir).
    Exists,
    /// Over [`MAX_FILE_BYTES`].
    TooLarge,
    /// The sandbox's permissions refused it (read-only place, the file's mode).
    Denied,
    /// The request itself is malformed (bad base64, mode, depth).
    Invalid,
    /// Anything else the file system said.
    Io,
}

/// A path in a place: the place and the components below it (none: the place itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlace {
    pub place: &'static str,
    pub below: Vec<String>,
}

impl InPlace {
    /// The normalised path.
    pub fn path(&self) -> String {
        let mut text = self.place.to_owned();
        for name in &self.below {
            text.push('/');
            text.push_str(name);
        }
        text
    }
}

/// Normalises `path` lexically (`.` dropped, `..` popped: `/workspace/../etc` is `/etc`) and
/// finds its place; anything outside [`FILE_PLACES`] (or not absolute, or with a control
/// character) is [`FileFailure::Outside`]. Symlinks are the file system's matter: the init
/// refuses them while it resolves the components.
pub fn locate(path: &str) -> Result<InPlace, FileFailure> {
    if path.len() > MAX_PATH_BYTES || path.chars().any(char::is_control) || !path.starts_with('/') {
        return Err(FileFailure::Outside);
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name if name.len() > MAX_NAME_BYTES => return Err(FileFailure::Outside),
            name => parts.push(name),
        }
    }
    for place in FILE_PLACES {
        let names: Vec<&str> = place.split('/').skip(1).collect();
        if parts.len() >= names.len() && parts[..names.len()] == names[..] {
            let below = parts[names.len()..].iter().map(|s| (*s).to_owned());
            return Ok(InPlace {
                place,
                below: below.collect(),
            });
        }
    }
    Err(FileFailure::Outside)
}

/// The init's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileAnswer {
    /// A read: the bytes and what was read.
    Content {
        content_b64: String,
        entry: FileEntry,
    },
    /// A write, stat, mkdir or rename: the entry as it is now.
    Entry {
        entry: FileEntry,
    },
    /// A listing, in the order found; `truncated`: [`MAX_LIST_ENTRIES`] stopped it.
    Entries {
        entries: Vec<FileEntry>,
        truncated: bool,
    },
    Removed,
    Failed {
        failure: FileFailure,
        message: String,
    },
}

/// The answer line for `nonce`.
pub fn file_answer(nonce: &str, answer: &FileAnswer) -> Vec<u8> {
    let mut line = FILE_ANSWER_PREFIX.to_vec();
    line.extend_from_slice(nonce.as_bytes());
    line.push(b':');
    match serde_json::to_vec(answer) {
        Ok(json) => line.extend_from_slice(&json),
        Err(_) => line.extend_from_slice(
            br#"{"answer":"failed","failure":"io","message":"the answer could not be encoded"}"#,
        ),
    }
    line.push(b'\n');
    line
}

/// A read's answer line for `nonce`, as [`file_answer`] gives for [`FileAnswer::Content`], with
/// `content` encoded straight into the line: a 16 MiB read otherwise holds the bytes, their
/// base64, the JSON and the line at once (over 80 MB in the sandbox, counted against the
/// session's memory limit), here the bytes and the line.
pub fn content_answer(nonce: &str, content: &[u8], entry: &FileEntry) -> Vec<u8> {
    use base64::Engine as _;
    let Ok(entry_json) = serde_json::to_vec(entry) else {
        let failed = FileAnswer::Failed {
            failure: FileFailure::Io,
            message: "the answer could not be encoded".into(),
        };
        return file_answer(nonce, &failed);
    };
    let encoded = content.len().div_ceil(3) * 4;
    let mut line = Vec::with_capacity(
        FILE_ANSWER_PREFIX.len() + nonce.len() + 64 + encoded + entry_json.len(),
    );
    line.extend_from_slice(FILE_ANSWER_PREFIX);
    line.extend_from_slice(nonce.as_bytes());
    line.extend_from_slice(br#":{"answer":"content","content_b64":""#);
    let start = line.len();
    line.resize(start + encoded, 0);
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(content, &mut line[start..])
        .unwrap_or(0);
    line.truncate(start + written);
    line.extend_from_slice(br#"","entry":"#);
    line.extend_from_slice(&entry_json);
    line.extend_from_slice(b"}\n");
    line
}

/// Finds the answer for one nonce in a stderr stream; everything else is dropped (between
/// turns, what the program's leftovers print belongs to no execution). Holds at most the
/// prefix plus [`MAX_ANSWER_BYTES`].
#[derive(Debug)]
pub struct FileAnswerTaker {
    prefix: Vec<u8>,
    /// Before the prefix: what could still begin it; after: the answer so far.
    held: Vec<u8>,
    /// The prefix came; `held` holds what follows it.
    started: bool,
    /// How much of `held` is known to hold no newline (each byte is looked at once).
    scanned: usize,
}

impl FileAnswerTaker {
    pub fn new(nonce: &str) -> FileAnswerTaker {
        let mut prefix = FILE_ANSWER_PREFIX.to_vec();
        prefix.extend_from_slice(nonce.as_bytes());
        prefix.push(b':');
        FileAnswerTaker {
            prefix,
            held: Vec::new(),
            started: false,
            scanned: 0,
        }
    }

    /// Feeds a stderr chunk; the answer once it is complete (`Err`: one that does not parse).
    pub fn feed(&mut self, chunk: &[u8]) -> Option<Result<FileAnswer, String>> {
        self.held.extend_from_slice(chunk);
        if !self.started {
            let Some(start) = find(&self.held, &self.prefix) else {
                // Keep only what could still begin the prefix.
                let keep = self.prefix.len().saturating_sub(1).min(self.held.len());
                self.held.drain(..self.held.len() - keep);
                return None;
            };
            self.held.drain(..start + self.prefix.len());
            self.started = true;
        }
        if let Some(offset) = self.held[self.scanned..].iter().position(|b| *b == b'\n') {
            let line = &self.held[..self.scanned + offset];
            return Some(serde_json::from_slice(line).map_err(|err| format!("bad answer: {err}")));
        }
        self.scanned = self.held.len();
        if self.held.len() > MAX_ANSWER_BYTES {
            self.held.clear();
            self.scanned = 0;
            return Some(Err("the answer is longer than its limit".to_owned()));
        }
        None
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_and_closed() {
        let line = r#"{"op":"rename","from":"/tmp/a","to":"/tmp/b"}"#;
        let request: FileRequest = serde_json::from_str(line).unwrap();
        assert_eq!(
            request,
            FileRequest::Rename {
                from: "/tmp/a".into(),
                to: "/tmp/b".into()
            }
        );
        assert_eq!(serde_json::to_string(&request).unwrap(), line);
        assert!(
            serde_json::from_str::<FileRequest>(r#"{"op":"read","path":"/tmp/a","x":1}"#).is_err()
        );
        assert!(serde_json::from_str::<FileRequest>(r#"{"op":"chown","path":"/tmp/a"}"#).is_err());
        // A job line is never a file line, nor the other way round.
        assert!(serde_json::from_str::<FileLine>(r#"{"argv":["x"],"exit_nonce":"n"}"#).is_err());
        let file = format!(r#"{{"file":{line},"exit_nonce":"n0nce"}}"#);
        assert!(serde_json::from_str::<FileLine>(&file).is_ok());
        assert!(serde_json::from_str::<crate::Job>(&file).is_err());
    }

    #[test]
    fn the_answer_is_found_wherever_the_chunks_split_and_forgeries_are_not() {
        let answer = FileAnswer::Failed {
            failure: FileFailure::Symlink,
            message: "no".into(),
        };
        let mut stream = b"noise\0sandgate-file:guess:{\"answer\":\"removed\"}\n".to_vec();
        stream.extend(file_answer("n0nce", &answer));
        for split in 0..stream.len() {
            let mut taker = FileAnswerTaker::new("n0nce");
            let (a, b) = stream.split_at(split);
            let got = taker.feed(a).or_else(|| taker.feed(b));
            assert_eq!(got, Some(Ok(answer.clone())), "{split}");
        }
    }

    #[test]
    fn a_content_answer_is_the_read_answer_and_taken_as_one() {
        let entry = FileEntry {
            path: "/tmp/a".into(),
            name: "a".into(),
            kind: FileKind::File,
            size: 4,
            mode: 0o644,
            mtime_ns: 7,
            symlink_target: None,
        };
        for content in [&b""[..], b"a", b"ab", b"abc", b"\0\n\xff\"x"] {
            let answer = FileAnswer::Content {
                content_b64: base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    content,
                ),
                entry: entry.clone(),
            };
            let line = content_answer("n0nce", content, &entry);
            let mut taker = FileAnswerTaker::new("n0nce");
            assert_eq!(taker.feed(&line), Some(Ok(answer.clone())));
            assert_eq!(line, file_answer("n0nce", &answer));
        }
    }

    #[test]
    fn paths_are_normalised_then_must_lie_in_a_place() {
        let at = locate("/workspace/./a//b/../c").unwrap();
        assert_eq!(at.place, "/workspace");
        assert_eq!(at.below, ["a", "c"]);
        assert_eq!(locate("/home/user").unwrap().below, Vec::<String>::new());
        for bad in [
            "/etc/passwd",
            "/workspace/../etc/passwd",
            "/tmp/../../sandgate/init",
            "workspace/a",
            "/home/other",
            "/workspacex/a",
            "/tmp/a\0b",
            "",
        ] {
            assert_eq!(locate(bad), Err(FileFailure::Outside), "{bad:?}");
        }
    }
}
