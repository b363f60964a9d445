//! The session file API's wire types (`/v1/sessions/{id}/files...`).

use serde::{Deserialize, Serialize};

/// What a path names (`lstat`: a symlink is never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionFileKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

crate::text_forms::text_forms!(SessionFileKind {
    File => "file",
    Dir => "dir",
    Symlink => "symlink",
    Other => "other",
});

/// One file, directory or symlink in a session's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionFileEntry {
    /// Absolute and normalised.
    pub path: String,
    pub name: String,
    pub kind: SessionFileKind,
    pub size: u64,
    /// Permission bits, as a number (`420` is `0o644`).
    pub mode: u32,
    /// Last modification, Unix time in nanoseconds.
    pub mtime_ns: i64,
    /// A symlink's target, as stored (never followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// `GET /v1/sessions/{id}/files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionFileList {
    pub entries: Vec<SessionFileEntry>,
    /// The entry limit stopped the listing.
    pub truncated: bool,
}

/// `POST /v1/sessions/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionFileMkdir {
    pub path: String,
}

/// `POST /v1/sessions/{id}/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionFileMove {
    pub from: String,
    pub to: String,
}

/// `PUT /v1/sessions/{id}/files/content`: the entry written and the SHA-256 of its bytes (as
/// the audit event `session.file_written` records it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionFileWritten {
    pub entry: SessionFileEntry,
    pub sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_spell_as_their_text_form() {
        crate::text_forms::assert_serde_matches(SessionFileKind::ALL, |kind| kind.as_str());
    }
}
