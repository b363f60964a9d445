//! `session.file_written`, `session.file_moved`, `session.file_removed`: a change an agent
//! made through the session's file API (`app::session_files`), committed before the sandbox's
//! init carries it out. Paths are normalised, and bounded as in refusals (a long one keeps its
//! first 128 bytes, its length and its SHA-256).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The decision of every file event: nothing (`{}`), the change was the caller's to make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoDecision {}

/// `session.file_written`'s input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileWritten {
    pub session_id: String,
    pub path: Value,
    pub bytes: u64,
    pub sha256: String,
    /// Permission bits asked for; `null`: the default (new file) or unchanged.
    pub mode: Option<u32>,
}

/// `session.file_moved`'s input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileMoved {
    pub session_id: String,
    pub from: Value,
    pub to: Value,
}

/// `session.file_removed`'s input (a directory with everything under it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRemoved {
    pub session_id: String,
    pub path: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The documented form (docs/audit.md), key for key: an absent mode is `null`.
    #[test]
    fn payloads_have_the_documented_keys() {
        let written = FileWritten {
            session_id: "ss_1".into(),
            path: json!("/workspace/a"),
            bytes: 2,
            sha256: "ab".into(),
            mode: None,
        };
        assert_eq!(
            super::super::column(&written).to_string(),
            r#"{"bytes":2,"mode":null,"path":"/workspace/a","session_id":"ss_1","sha256":"ab"}"#
        );
        let moved = FileMoved {
            session_id: "ss_1".into(),
            from: json!("/tmp/a"),
            to: json!({"prefix": "/tmp/b", "bytes": 300, "sha256": "cd"}),
        };
        let back: FileMoved = serde_json::from_value(super::super::column(&moved)).unwrap();
        assert_eq!(back, moved);
    }
}
