//! envd's `filesystem.Filesystem` Connect service (unary calls, Connect's JSON codec, as the
//! E2B SDKs send them): `Stat`, `MakeDir`, `Move`, `ListDir`, `Remove`, each one a session
//! file operation (`app::session_files`: who may is who may run code in the session; moves
//! and removals audited; paths confined to the sandbox's writable places, never through a
//! symlink). The watchers (`WatchDir`, `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`)
//! are `super::watch`.
//!
//! Relative paths are taken from the sandbox's home (`/home/user` where the image has it,
//! else `/workspace`), as E2B's envd takes them from the user's home. The SDK's user (an
//! `Authorization: Basic` header) changes nothing: every operation runs as the sandbox's one
//! unprivileged user.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::response::Response;
use axum::Extension;
use serde::{Deserialize, Serialize};

use super::connect::{decode, Code, ConnectError};
use super::envd::{answer_error, connect_error, json_codec, reach, unary, LiveState, Reached};
use crate::app::session_files::{FileKind, SessionFileError, MAX_LIST_DEPTH};
use crate::app::App;
use sandbox_protocol::{FileEntry, FileFailure};

/// `filesystem.Filesystem/{method}`.
pub async fn filesystem(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Path(method): Path<String>,
    parts: Parts,
    body: Bytes,
) -> Response {
    let streaming = method == "WatchDir";
    if let Err(err) = json_codec(&parts, streaming) {
        return answer_error(&err, streaming);
    }
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return answer_error(&err, streaming),
    };
    if streaming {
        return super::watch::watch_dir(&app, &reached, &parts, &body).await;
    }
    match call(&app, &reached, &method, &body).await {
        Ok(response) => response,
        Err(err) => answer_error(&err, streaming),
    }
}

async fn call(
    app: &App,
    reached: &Reached,
    method: &str,
    body: &[u8],
) -> Result<Response, ConnectError> {
    let (key, id) = (&reached.key, reached.id.as_str());
    match method {
        "Stat" => {
            let request: PathRequest = decode(body)?;
            let path = absolute(&request.path);
            let entry = app.session_file_stat(key, id, &path).await;
            Ok(unary(&EntryResponse::from(entry.map_err(file_error)?)))
        }
        "MakeDir" => make_dir(app, reached, decode(body)?).await,
        "Move" => {
            let request: MoveRequest = decode(body)?;
            let from = absolute(&request.source);
            let to = absolute(&request.destination);
            let entry = app.session_file_rename(key, id, &from, &to).await;
            Ok(unary(&EntryResponse::from(entry.map_err(file_error)?)))
        }
        "ListDir" => list_dir(app, reached, decode(body)?).await,
        "Remove" => {
            let request: PathRequest = decode(body)?;
            let path = absolute(&request.path);
            app.session_file_remove(key, id, &path)
                .await
                .map_err(file_error)?;
            Ok(unary(&serde_json::json!({})))
        }
        "CreateWatcher" => super::watch::create(app, reached, body).await,
        "GetWatcherEvents" => super::watch::events(reached, body).await,
        "RemoveWatcher" => super::watch::remove(reached, body),
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{method} is no method of filesystem.Filesystem"),
        )),
    }
}

/// `MakeDir`: `already_exists` for an existing directory (the SDK's `make_dir` then says
/// `False`), as E2B's envd answers.
async fn make_dir(
    app: &App,
    reached: &Reached,
    request: PathRequest,
) -> Result<Response, ConnectError> {
    let path = absolute(&request.path);
    let (key, id) = (&reached.key, reached.id.as_str());
    match app.session_file_stat(key, id, &path).await {
        Ok(entry) if entry.kind == FileKind::Dir => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory {path} already exists"),
            ))
        }
        Ok(_) => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("{path} exists and is not a directory"),
            ))
        }
        Err(SessionFileError::Refused {
            failure: FileFailure::NotFound,
            ..
        }) => {}
        Err(err) => return Err(file_error(err)),
    }
    let entry = app.session_file_mkdir(key, id, &path).await;
    Ok(unary(&EntryResponse::from(entry.map_err(file_error)?)))
}

/// `ListDir`: `depth` 0 is 1 (the SDK's default), more than [`MAX_LIST_DEPTH`] is refused.
async fn list_dir(
    app: &App,
    reached: &Reached,
    request: ListDirRequest,
) -> Result<Response, ConnectError> {
    let depth = request.depth.max(1);
    if depth > MAX_LIST_DEPTH {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("depth {depth} is over sandgate's limit of {MAX_LIST_DEPTH}"),
        ));
    }
    let path = absolute(&request.path);
    let listing = app
        .session_file_list(&reached.key, &reached.id, &path, depth)
        .await
        .map_err(file_error)?;
    let entries = listing.entries.iter().map(EntryInfo::from).collect();
    Ok(unary(&ListDirResponse { entries }))
}

/// `path` as an absolute path: a relative one (or `~/...`) is under the sandbox's home
/// (envd's rule): `/home/user`, a writable place of every sandbox.
pub(super) fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        return path.to_owned();
    }
    joined(crate::runtime::USER_HOME, path)
}

fn joined(home: &str, path: &str) -> String {
    let rest = path.strip_prefix("~/").unwrap_or(path);
    let rest = if rest == "~" { "" } else { rest };
    format!("{home}/{rest}").trim_end_matches('/').to_owned()
}

/// A file operation's refusal as Connect's error: the SDK's `FileNotFoundException` for
/// `not_found`, `InvalidArgumentException` for a malformed request, and a `SandboxException`
/// naming `permission_denied` for a path outside the writable places or through a symlink.
pub(super) fn file_error(err: SessionFileError) -> ConnectError {
    match err {
        SessionFileError::App(err) => connect_error(err),
        SessionFileError::Refused { failure, message } => {
            let code = match failure {
                FileFailure::NotFound => Code::NotFound,
                FileFailure::Outside | FileFailure::Symlink | FileFailure::Denied => {
                    Code::PermissionDenied
                }
                FileFailure::Exists => Code::AlreadyExists,
                FileFailure::TooLarge
                | FileFailure::NotADirectory
                | FileFailure::IsADirectory
                | FileFailure::NotAFile
                | FileFailure::Invalid => Code::InvalidArgument,
                FileFailure::Io => Code::Internal,
            };
            ConnectError::new(code, message)
        }
    }
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Debug, Serialize)]
struct EntryResponse {
    entry: EntryInfo,
}

impl From<FileEntry> for EntryResponse {
    fn from(entry: FileEntry) -> EntryResponse {
        EntryResponse {
            entry: EntryInfo::from(&entry),
        }
    }
}

#[derive(Debug, Serialize)]
struct ListDirResponse {
    entries: Vec<EntryInfo>,
}

/// envd's `filesystem.EntryInfo` in Connect's JSON (int64 as a string, the timestamp in
/// RFC 3339). A symlink is `FILE_TYPE_SYMLINK` with `isSymlink` (never followed, so its
/// target's type is not known); a FIFO, socket or device `FILE_TYPE_UNSPECIFIED` (the SDK
/// leaves those out of listings).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EntryInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: String,
    mode: u32,
    permissions: String,
    owner: &'static str,
    group: &'static str,
    modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink_target: Option<String>,
    is_symlink: bool,
}

impl From<&FileEntry> for EntryInfo {
    fn from(entry: &FileEntry) -> EntryInfo {
        let kind = match entry.kind {
            FileKind::File => "FILE_TYPE_FILE",
            FileKind::Dir => "FILE_TYPE_DIRECTORY",
            FileKind::Symlink => "FILE_TYPE_SYMLINK",
            FileKind::Other => "FILE_TYPE_UNSPECIFIED",
        };
        let modified = chrono::DateTime::from_timestamp_nanos(entry.mtime_ns);
        EntryInfo {
            name: entry.name.clone(),
            kind,
            path: entry.path.clone(),
            size: entry.size.to_string(),
            mode: entry.mode,
            permissions: permissions(entry.kind, entry.mode),
            owner: "user",
            group: "user",
            modified_time: modified.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            symlink_target: entry.symlink_target.clone(),
            is_symlink: entry.kind == FileKind::Symlink,
        }
    }
}

/// `ls -l`'s permission string (`drwxr-xr-x`), as envd gives it.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut text = String::from(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File | FileKind::Other => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_home_user() {
        assert_eq!(joined("/home/user", "a.txt"), "/home/user/a.txt");
        assert_eq!(joined("/workspace", "~/d/a"), "/workspace/d/a");
        assert_eq!(joined("/workspace", "~"), "/workspace");
        // `..` is the path rules' matter (`sandbox_protocol::locate`): this only joins.
        assert_eq!(
            joined("/workspace", "../../etc/passwd"),
            "/workspace/../../etc/passwd"
        );
    }

    #[test]
    fn an_entry_is_envd_s_entry_info() {
        let entry = FileEntry {
            path: "/home/user/d".to_owned(),
            name: "d".to_owned(),
            kind: FileKind::Dir,
            size: 4096,
            mode: 0o755,
            mtime_ns: 1_700_000_000_000_000_000,
            symlink_target: None,
        };
        let json = serde_json::to_value(EntryInfo::from(&entry)).unwrap();
        assert_eq!(json["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(json["size"], "4096");
        assert_eq!(json["permissions"], "drwxr-xr-x");
        assert_eq!(json["modifiedTime"], "2023-11-14T22:13:20.000000000Z");
        assert_eq!(json["isSymlink"], false);
    }
}
